#!/usr/bin/env bash
# troupe as a library: `cmake --install` of this build into a scratch prefix, then
# examples/consumer -- a project of its own with find_package(troupe) -- built against
# it, its programs run under mpirun -np 2, and train_blobs under the installed
# troupe-run with a crash and a resume that ends with the same parameters. The actor
# program is also built with nothing but `pkg-config troupe` (by g++ and clang++, which
# also parses every installed header), and with troupe pulled in
# by add_subdirectory (configured) and FetchContent from a source tarball (built, run),
# and against this build's Debian package, unpacked.
#
#   consumer_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
fail() { echo "FAIL: $*"; exit 1; }
mpirun2() { mpirun -np 2 --oversubscribe --bind-to none "$@"; }

echo "== cmake --install into $prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in bin/troupe-run bin/troupe-ckpt lib/cmake/troupe/troupeConfig.cmake lib/cmake/troupe/troupeConfigVersion.cmake \
         lib/pkgconfig/troupe.pc include/troupe/version.hpp include/troupe/train/train_worker.hpp \
         share/troupe/tools/load_in_torch.py share/troupe/tools/plot_metrics.py; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
ls "$prefix"/lib/libtroupe_*.so* > /dev/null || fail "no shared libraries installed"
# A CUDA build's backend is a plugin loaded from beside libtroupe_tensor (CUDA on demand).
if [ -e "$build/tensor/libtroupe_tensor_cuda.so" ]; then
  [ -e "$prefix/lib/libtroupe_tensor_cuda.so" ] || fail "the CUDA backend plugin is not installed beside libtroupe_tensor"
fi
"$prefix/bin/troupe-run" --version | grep -qx "troupe-run (troupe) [0-9.]*" || fail "troupe-run --version"
"$prefix/bin/troupe-ckpt" --version | grep -qx "troupe-ckpt (troupe) [0-9.]*" || fail "troupe-ckpt --version"

echo "== the consumer, with find_package(troupe)"
cmake -S "$source/examples/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  > "$work/configure.log" || { cat "$work/configure.log"; fail "configuring the consumer"; }
cmake --build "$work/consumer" -j 2 > "$work/build.log" 2>&1 || { cat "$work/build.log"; fail "building the consumer"; }
# Nothing of troupe's source or build tree may be reached by the consumer's build.
if grep -E -- "-I[^ ]*($source|$build)" "$work/consumer/CMakeFiles/"*/flags.make; then
  fail "the consumer's build reads troupe's own tree"
fi

echo "== hello_actors and train_blobs under mpirun -np 2"
mpirun2 "$work/consumer/hello_actors" > "$work/hello.log" 2>&1 || { cat "$work/hello.log"; fail "hello_actors"; }
cat "$work/hello.log"
grep -q "10 + 5 on rank 1 = 15" "$work/hello.log" || fail "hello_actors' answer"
grep -q "every rank's 100 + 1, summed: 202" "$work/hello.log" || fail "hello_actors' when_all"
mpirun2 "$work/consumer/train_blobs" 5 > "$work/blobs.log" 2>&1 || { cat "$work/blobs.log"; fail "train_blobs"; }
tail -2 "$work/blobs.log"
awk '/final test accuracy/ { if ($4 + 0 < 0.9) exit 1; found = 1 } END { exit !found }' "$work/blobs.log" \
  || fail "train_blobs' accuracy"
hash=$(grep -o 'parameters hash [0-9a-f]*' "$work/blobs.log")

echo "== train_blobs under the installed troupe-run: crash at step 30, resume"
TROUPE_FAULT_ARMED=1 TROUPE_FAULT=rank=1,step=30,kind=crash,restart=0 "$prefix/bin/troupe-run" -np 2 --backoff 0 \
  --checkpoint-dir "$work/run" -- "$work/consumer/train_blobs" 5 > "$work/run.log" 2>&1 \
  || { cat "$work/run.log"; fail "troupe-run did not finish the job"; }
grep -E "failure|resumed|final" "$work/run.log"
grep -q "resumed at step" "$work/run.log" || fail "the relaunch did not resume"
grep -q "$hash" "$work/run.log" || fail "after the resume, not the uninterrupted run's $hash"

echo "== the checkpoints: troupe-ckpt, h5py, PyTorch"
last=$work/run/ckpt-000000160.h5
"$prefix/bin/troupe-ckpt" verify "$work/run" > /dev/null || fail "troupe-ckpt verify of the run's checkpoints"
"$prefix/bin/troupe-ckpt" ls "$last" | grep -q "model" || fail "troupe-ckpt ls $last"
/usr/bin/python3 -c "import h5py, sys; f = h5py.File(sys.argv[1]); print(sorted(f['model']))" "$last" \
  | grep -q "0.weight" || fail "h5py reading $last"
if /usr/bin/python3 -c "import torch" 2> /dev/null; then
  /usr/bin/python3 "$prefix/share/troupe/tools/load_in_torch.py" "$last" "$work/blobs.pt" > "$work/torch.log" 2>&1 \
    || { cat "$work/torch.log"; fail "load_in_torch.py $last"; }
  /usr/bin/python3 -c "import torch, sys; print(torch.load(sys.argv[1])['0.weight'].shape)" "$work/blobs.pt" \
    | grep -q "torch.Size(\[32, 2\])" || fail "torch.load of the exported state dict"
else
  echo "(python3-torch missing: load_in_torch.py not run)"
fi

echo "== the Debian package of this build: its Depends resolve, and the consumer builds against it"
# scripts/package builds the CPU-only release package; the same CPack rules package
# this build in a second. Unpacked with dpkg -x rather than installed, to leave /usr alone.
(cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/deb" > "$work/cpack.log" 2>&1) \
  || { cat "$work/cpack.log"; fail "cpack -G DEB"; }
deb=$(ls "$work"/deb/troupe_*_amd64.deb)
depends=$(dpkg-deb -f "$deb" Depends)
for p in openmpi-bin libopenmpi-dev libhdf5-openmpi-dev libcereal-dev libboost-dev libopenblas-dev; do
  grep -qw "$p" <<< "$depends" || fail "the package does not depend on $p: $depends"
done
if [ "$(id -u)" -eq 0 ]; then
  apt-get install -s "$deb" > "$work/apt.log" 2>&1 || { cat "$work/apt.log"; fail "apt-get cannot resolve the package's Depends"; }
fi
dpkg -x "$deb" "$work/debroot"
cmake -S "$source/examples/consumer" -B "$work/consumer-deb" -DCMAKE_PREFIX_PATH="$work/debroot/usr" \
  -DCMAKE_BUILD_TYPE= > "$work/configure-deb.log" 2>&1 || { cat "$work/configure-deb.log"; fail "configuring against the .deb"; }
cmake --build "$work/consumer-deb" --target hello_actors -j 2 > "$work/build-deb.log" 2>&1 \
  || { cat "$work/build-deb.log"; fail "building against the .deb"; }
grep -q "$work/debroot/usr/include" "$work/consumer-deb/CMakeFiles/hello_actors.dir/flags.make" \
  || fail "the consumer did not take troupe's headers from the package"
mpirun2 "$work/consumer-deb/hello_actors" | grep -q "10 + 5 on rank 1 = 15" || fail "the .deb build's answer"

echo "== hello_actors with pkg-config only"
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --exists troupe || fail "pkg-config cannot find troupe"
# shellcheck disable=SC2046
g++ -O1 "$source/examples/consumer/hello_actors.cpp" -o "$work/hello_pc" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs troupe) || fail "building with pkg-config"
mpirun2 "$work/hello_pc" | grep -q "10 + 5 on rank 1 = 15" || fail "the pkg-config build's answer"

echo "== every installed header, and hello_actors, under clang"
# troupe is built with GCC; a header only GCC accepts breaks every clang user's build
# (as clang < 19 refused a sized aligned operator delete in actors' call.hpp).
command -v clang++ > /dev/null || fail "clang++ is missing (scripts/setup installs clang)"
(cd "$prefix/include" && find troupe -name '*.hpp' | sort | sed 's/.*/#include "&"/') > "$work/all_headers.cpp"
# shellcheck disable=SC2046
clang++ -fsyntax-only "$work/all_headers.cpp" $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags troupe) \
  || fail "clang++ rejects an installed header"
# shellcheck disable=SC2046
clang++ -O1 "$source/examples/consumer/hello_actors.cpp" -o "$work/hello_clang" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs troupe) || fail "building with clang++"
mpirun2 "$work/hello_clang" | grep -q "10 + 5 on rank 1 = 15" || fail "the clang build's answer"
echo "== troupe as a subdirectory of another project (configured, not built)"
mkdir -p "$work/outer"
cat > "$work/outer/CMakeLists.txt" <<OUTER
cmake_minimum_required(VERSION 3.25)
project(outer LANGUAGES CXX)
add_subdirectory("$source" troupe)
add_executable(hello "$source/examples/consumer/hello_actors.cpp")
target_link_libraries(hello PRIVATE troupe::actors)
OUTER
cmake -S "$work/outer" -B "$work/outer/build" -G Ninja > "$work/outer.log" 2>&1 || { cat "$work/outer.log"; fail "add_subdirectory(troupe)"; }
targets=$(ninja -C "$work/outer/build" -t targets all)
grep -q "^hello:" <<< "$targets" || fail "the outer project's target is missing"
grep -qE "^(tests/|bench/|examples/)?[a-z_/]*(train_test|collectives_bench|ping_pong|train_digits):" <<< "$targets" \
  && fail "tests, benchmarks or examples are built for a project that includes troupe"
ninja -C "$work/outer/build" -t commands hello | grep -q -- "-Wextra" && fail "troupe forced its warning flags on the outer project"
grep -q "^CMAKE_BUILD_TYPE:STRING=$" "$work/outer/build/CMakeCache.txt" || fail "troupe forced a build type"

echo "== troupe through FetchContent from a source tarball: hello_actors built and run"
# The tarball holds what git tracks (as in the working tree), as a release would.
(cd "$source" && git ls-files --cached --others --exclude-standard | while read -r f; do [ -f "$f" ] && echo "$f"; done) \
  > "$work/files.txt"
tar czf "$work/troupe-src.tar.gz" -C "$source" --transform 's,^,troupe/,' -T "$work/files.txt"
mkdir -p "$work/fetch"
cat > "$work/fetch/CMakeLists.txt" <<FETCH
cmake_minimum_required(VERSION 3.25)
project(fetch_user LANGUAGES CXX)
include(FetchContent)
FetchContent_Declare(troupe URL "file://$work/troupe-src.tar.gz")
FetchContent_MakeAvailable(troupe)
add_executable(hello "$source/examples/consumer/hello_actors.cpp")
target_link_libraries(hello PRIVATE troupe::actors)
FETCH
# No build type (no -O): what is checked is that it builds and runs, not its speed.
cmake -S "$work/fetch" -B "$work/fetch/build" -G Ninja -DCMAKE_BUILD_TYPE= > "$work/fetch.log" 2>&1 \
  || { cat "$work/fetch.log"; fail "FetchContent(troupe)"; }
cmake --build "$work/fetch/build" --target hello -j 2 > "$work/fetch-build.log" 2>&1 \
  || { tail -40 "$work/fetch-build.log"; fail "building hello with troupe from FetchContent"; }
mpirun2 "$work/fetch/build/hello" | grep -q "10 + 5 on rank 1 = 15" || fail "the FetchContent build's answer"
echo "PASS"
