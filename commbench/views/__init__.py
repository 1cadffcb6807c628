"""Views over run directories (read files only; never torch.distributed).

`rundata` loads a run and holds the selection and ordering rules every view follows; `plots` the figure registry
and the run's figures; `tables`, `training_tables` and `metadata_tables` the tables; `findings` what is significant
enough to state; `render` the HTML and Markdown documents; `report` and `compare` write the two documents.
"""
