"""The run directory: journal, CSV and parquet tables, loaders into pandas, and the nccl-tests importer."""
