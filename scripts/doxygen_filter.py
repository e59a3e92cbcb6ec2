#!/usr/bin/python3
"""Doxygen's input filter (FILTER_PATTERNS in docs/Doxyfile): reads a public header and
writes it with its comments turned into Doxygen's.

troupe's headers carry plain `//` comments that say why (the project's style); this filter
makes them documentation for the API reference only, the headers stay as they are:

  - the comment block at the very top of a file (before `#pragma once`) becomes the
    file's documentation (`\\file` appended to its last line);
  - a `//` block directly above a declaration at namespace, class or enum scope becomes
    `///` (a block followed by a blank line, an access specifier, `}` or a preprocessor
    line other than `#define` is a section note and stays `//`);
  - a trailing `// ...` after a member on the same line becomes `///< ...`, and so do the
    comment-only lines right below it that continue it (same column);
  - comments inside function bodies stay `//`: they explain the code, not the API;
    so do `// NOLINT` notes for clang-tidy.

Converted text is escaped where Doxygen would misread it (`<T>` as an HTML tag, `@`,
`\\`, `#`, `%`, `&`, `$` as commands or links), except inside Markdown code spans.
Every input line gives exactly one output line, so Doxygen's line numbers are the
header's. Given a Markdown page instead (README.md, docs/*.md), it only adds the
heading ids that the page's own links need (filter_markdown).
Usage (what Doxygen runs): doxygen_filter.py <file>.
"""
import re
import sys
from collections import namedtuple

# Characters Doxygen reads as commands, HTML, entities or links in documentation text.
SPECIAL = re.compile(r"([\\@<&#%$])")
# Abbreviations whose dot must not end a JAVADOC_AUTOBRIEF brief description.
ABBREVIATION = re.compile(r"\b(e\.g\.|i\.e\.|vs\.|cf\.) ")
ACCESS = re.compile(r"^(public|private|protected)\s*:")
# What opens a scope that holds declarations (rather than a function body or initializer).
DECL_SCOPE = re.compile(r'^(export\s+)?((inline\s+)?namespace\b|extern\s+"|(typedef\s+)?(class|struct|union|enum)\b)')

# One header line: its code (comments and literals blanked), the column of its `//`
# (None without one), and the kind of scope ("decl" or "body") it starts and ends in.
Line = namedtuple("Line", "code col start end")


def split_code_comment(line, in_block_comment):
    """Returns (code, comment_column or None, in_block_comment) with strings, chars and
    /* */ comments blanked out of `code`, so that braces and `//` are found reliably."""
    code = []
    i, n = 0, len(line)
    while i < n:
        if in_block_comment:
            end = line.find("*/", i)
            if end < 0:
                return "".join(code), None, True
            code.append(" " * (end + 2 - i))
            i = end + 2
            in_block_comment = False
            continue
        c = line[i]
        if line.startswith("//", i):
            return "".join(code), i, False
        if line.startswith("/*", i):
            in_block_comment = True
            continue
        if c in "\"'":
            j = i + 1
            while j < n and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            code.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
            continue
        code.append(c)
        i += 1
    return "".join(code), None, in_block_comment


def strip_template_prefix(text):
    """`template <class T, ...> struct X` -> `struct X` (balanced angle brackets)."""
    while True:
        m = re.match(r"\s*template\s*<", text)
        if not m:
            return text.strip()
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"<": 1, ">": -1}.get(text[i], 0)
            i += 1
        text = text[i:]


def escape(text):
    """Escapes Doxygen's special characters outside Markdown code spans (`...`, ``...``)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "`":
            run = len(text[i:]) - len(text[i:].lstrip("`"))
            end = text.find("`" * run, i + run)
            if end >= 0:
                out.append(text[i:end + run])
                i = end + run
                continue
            out.append(text[i:i + run])
            i += run
            continue
        j = text.find("`", i)
        j = len(text) if j < 0 else j
        plain = SPECIAL.sub(r"\\\1", text[i:j])
        out.append(ABBREVIATION.sub(r"\1\\ ", plain))
        i = j
    return "".join(out)


def indented(text):
    """A comment line indented past the usual `// ` holds code, a table or a formula."""
    return text.startswith("   ") and text.strip() != ""


def escape_block(texts):
    """A block's lines as Doxygen text. Runs of indented lines (examples, tables,
    formulas: preformatted in the header) become code blocks, opened at the end of the
    line above and closed at the end of the run's last line, so no line is added; the
    prose between them is escaped as a whole, since a code span may run across lines."""
    out = list(texts)
    code = [False] * len(texts)
    opens = {}  # line index -> the command that opens a code block at its end
    k = 0
    while k < len(texts):
        if not indented(texts[k]):
            k += 1
            continue
        first = last = k
        while k < len(texts) and (indented(texts[k]) or not texts[k].strip()):
            if indented(texts[k]):
                last = k
            k += 1
        run = texts[first:last + 1]
        # C++ is highlighted; a table or a formula is shown as it is.
        command = "\\code" if any(";" in t for t in run) else "\\code{.unparsed}"
        for j in range(first, last + 1):
            code[j] = True
        if first > 0:
            opens[first - 1] = command
        else:
            out[first] = command + texts[first]
        out[last] += " \\endcode"
        k = last + 1
    k = 0
    while k < len(texts):
        if code[k]:
            k += 1
            continue
        first = k
        while k < len(texts) and not code[k]:
            k += 1
        prose = escape("\n".join(texts[first:k])).split("\n")
        for j, text in zip(range(first, k), prose):
            out[j] = text + (" " + opens[j] if j in opens else "")
    return out


def filter_lines(lines):
    out = list(lines)
    n = len(lines)

    # Pass 1: per line, the code (comments and literals blanked), where its `//` starts,
    # and whether the line begins and ends inside a declaration scope.
    scopes = ["decl"]  # one entry per open brace: "decl" or "body"
    statement = ""  # code since the last ; { } at this scope, to classify the next {
    in_block = False
    info = []
    for line in lines:
        code, col, in_block = split_code_comment(line, in_block)
        start_scope = scopes[-1]
        stripped = code.strip()
        if stripped.startswith("#") or ACCESS.match(stripped):
            statement = ""
        else:
            for ch in code:
                if ch == "{":
                    kind = "body"
                    if scopes[-1] == "decl" and DECL_SCOPE.match(strip_template_prefix(statement)) \
                            and "=" not in statement:
                        kind = "decl"
                    scopes.append(kind)
                    statement = ""
                elif ch == "}":
                    if len(scopes) > 1:
                        scopes.pop()
                    statement = ""
                elif ch == ";":
                    statement = ""
                else:
                    statement += ch
            statement += " "
        info.append(Line(code, col, start_scope, scopes[-1]))

    def comment_only(k):
        return info[k].col is not None and not info[k].code.strip()

    def declaration(k):
        s = info[k].code.strip()
        if not s or info[k].start != "decl":
            return False
        if s.startswith("#"):
            return s.startswith("#define")
        return not (s.startswith("}") or ACCESS.match(s) or s.startswith("static_assert")
                    or s.startswith("using namespace"))

    # Pass 2: comment blocks and trailing comments.
    k = 0
    while k < n:
        if comment_only(k):
            first = k
            while k < n and comment_only(k):
                k += 1
            block = range(first, k)
            texts = [lines[j][info[j].col + 2:] for j in block]
            if first == 0 and k < n and info[k].code.strip() == "#pragma once":
                texts = escape_block(texts)
                texts[-1] += " \\file"
            elif k < n and declaration(k):
                texts = escape_block(texts)
            else:
                continue
            for j, text in zip(block, texts):
                out[j] = lines[j][:info[j].col] + "///" + text
            continue
        col, s = info[k].col, info[k].code.strip()
        member = (col is not None and s and info[k].start == "decl" and info[k].end == "decl"
                  and not s.startswith(("#", "}")) and not ACCESS.match(s)
                  and (s.endswith((";", ",", "}")) or re.search(r"\w$", s)))
        if member and not lines[k][col + 2:].lstrip().startswith("NOLINT"):
            first = k
            k += 1
            while k < n and comment_only(k) and info[k].col == col:
                k += 1
            block = range(first, k)
            texts = escape_block([lines[j][col + 2:] for j in block])
            for j, text in zip(block, texts):
                out[j] = lines[j][:col] + "///<" + text
            continue
        k += 1
    return out


def filter_markdown(lines):
    """A Markdown page: the headings that the page itself links to (`[Status](#status)`)
    get that id explicitly, since Doxygen 1.9.4 does not derive ids from headings as
    GitHub does."""
    wanted = set(re.findall(r"\]\(#([\w-]+)\)", "\n".join(lines)))
    out, fenced = [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"^#{1,6} +(.*?)\s*$", line)
        if m:
            slug = re.sub(r"[^\w -]", "", m.group(1).lower()).replace(" ", "-")
            if slug in wanted:
                line = f"{line} {{#{slug}}}"
        out.append(line)
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: doxygen_filter.py <header or .md file>")
    path = sys.argv[1]
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    convert = filter_markdown if path.endswith(".md") else filter_lines
    sys.stdout.write("\n".join(convert(lines)))


if __name__ == "__main__":
    main()
