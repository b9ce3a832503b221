"""PySpark data source "tidelog": batch and streaming read, write."""
