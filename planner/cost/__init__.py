"""Pure cost formulas: no I/O, no printing, no globals. SI units throughout."""
