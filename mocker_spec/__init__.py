"""The imperative shell around the pure model: CLI, file formats, reference runner, exporters."""
