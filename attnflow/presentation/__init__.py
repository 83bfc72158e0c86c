"""What a person reads: the figure style (`_figures`), the summary plots (`_plots`) and
the reports across runs (`_report`). It imports the storage and the schema."""
