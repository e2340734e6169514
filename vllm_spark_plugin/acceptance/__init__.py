"""`vllm-spark check`: the acceptance run for the server a Spark owner already runs.

`cli` (the command: doctor, the adaptive sweep, the planner's prediction, in that order),
`prediction` (the plan for the served model, the run's size chosen from it, prediction beside
measurement), `report` (`report.html` and `check.json`).  It uses the doctor, the bench and the
planner through their public functions only.
"""
