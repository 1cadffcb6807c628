"""Capacity planning: the fitted cost model of a cluster's collectives and the plan built from it and the training strategies' formulas."""
