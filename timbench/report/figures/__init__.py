"""The figures of the reports: one module per kind of figure (curves, cells, heatmap, forest, survival, paper,
align) and the project's figure style; each draws from the report core's records."""
