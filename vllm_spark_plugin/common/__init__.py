"""The ground floor every side stands on, importing nothing of the plugin above `definitions`:
`errors` (contained failures: counted, logged once per kind, never raised into vLLM) and
`memory_sources` (the host's memory readers: /proc/meminfo, /proc/pressure/memory, the kernel log).
The exporter, the hooks, the doctor and the NVFP4 loader all read them; none of them owns them.
"""
