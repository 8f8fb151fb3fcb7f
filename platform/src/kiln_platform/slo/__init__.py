"""SLOs as data, their SLIs, error budgets, burn-rate alerts and their delivery."""
