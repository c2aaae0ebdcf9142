"""timbench.grid: the condition x remedy grid, its runner, and the reports that read its results."""
