"""Adapters that plug tito into RL frameworks (each one optional: the framework is never a
dependency; the adapter is duck-typed against the framework's field names).

* :mod:`tito.integrations.miles`: the reference framework's generate-function forms
  (miles; slime shares its rollout interfaces).
"""
