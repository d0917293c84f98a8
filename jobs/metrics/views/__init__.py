"""The metrics API: series, names, comparison and TensorBoard export."""
