"""What a person sees: one line per kernel, summaries and JUnit (`reports`), and the live progress
display of a terminal (`progress`)."""
