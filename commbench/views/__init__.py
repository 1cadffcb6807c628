"""Views over run directories (read files only; never torch.distributed): shared loading helpers, figures, the report, comparison of runs."""
