// placeholder until nn lands
