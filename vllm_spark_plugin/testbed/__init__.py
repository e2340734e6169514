"""The CPU test bed: the tiny local model (`tiny_model`), a real `vllm serve` with the plugin
(`server`, `serve_cli`), vLLM's router in front of such servers (`router`), the simulated server with a known step model (`fake_server`), and the demo
(`demo`) that runs the main job on them.
"""
