"""Capacity planning: the fitted cost model of a cluster's collectives and the plans built from it, the GPU presets
and the training strategies' formulas.

``costmodel`` (the model: predict with an interval) with ``algorithms`` (scaling formulas, the layout rule),
``interpolate``, ``fitting`` (fit it to a run's points; ``commbench fit``) and ``costmodel_io`` (its JSON file);
``options`` (the strategies, precisions and optimizers a plan crosses), ``pricing`` (memory, bytes and time of one
flat option), ``plan`` (validate, build the grid, rank; ``commbench.plan``) and ``plan_render``; one given layout:
``layout`` (its rules, split and FLOPs), ``ring`` and ``calls`` (each call priced with its latency), ``steptime``
(each cost once), ``layout_plan`` (``plan --tp --pp --dp``) and ``layout_render``; ``search`` over layouts.
"""
