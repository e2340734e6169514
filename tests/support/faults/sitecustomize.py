"""Faults injected into a test server's engine core (Python runs this at start-up in every process
whose PYTHONPATH holds this folder).  The plugin's own code is made to fail at two narrow seams, so
that the containment path (count, log once, spill to the API server) runs for real:

* start-up: `moe.tuned_configs.apply` raises in every process but the API server (the main one);
* per step: every `SPARK_TEST_FAULT_EVERY`-th scheduler-hook record fails to be added.
"""
import multiprocessing
import os

if os.environ.get("SPARK_TEST_FAULTS") == "1":
    every = int(os.environ.get("SPARK_TEST_FAULT_EVERY", "200"))

    def _in_api_server() -> bool:
        # decided at call time: a spawned process is still called MainProcess while this file runs
        return multiprocessing.current_process().name == "MainProcess"

    def _inject():
        from vllm_spark_plugin.hooks import channel
        from vllm_spark_plugin.moe import tuned_configs

        apply = tuned_configs.apply

        def failing_apply(*a, **k):
            if not _in_api_server():
                raise RuntimeError("injected start-up fault")
            return apply(*a, **k)
        tuned_configs.apply = failing_apply
        add, calls = channel.StepWriter.add, [0]

        def failing_add(self, *fields):
            calls[0] += 1
            if calls[0] % every == 0:
                raise RuntimeError("injected step fault")
            add(self, *fields)
        channel.StepWriter.add = failing_add

    try:
        _inject()
    except Exception:  # never stop the process under test
        pass
