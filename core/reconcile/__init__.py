"""The controller: reconcile and reap, level-triggered (plan from what is read, re-check
before acting). Plugs the pools' planner in beside its own."""
