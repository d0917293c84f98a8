"""A job's metrics: ingest, rollups, series for charts, comparison and
TensorBoard export."""
