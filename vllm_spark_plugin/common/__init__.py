"""The ground floor every side stands on, importing nothing of the plugin above `definitions`:
`errors` (contained failures: counted, logged once per kind, never raised into vLLM),
`memory_sources` (the host's memory readers: /proc/meminfo, /proc/pressure/memory, the kernel log),
`link_sources` (the network links a multi-node deployment runs over: sysfs netdev and RDMA
counters, negotiated rates, the NIC's PCIe link, NIC messages of the kernel log) and `units` (sizes
as a command line takes them: `2GB`, `512MiB`).
The exporter, the hooks, the doctor and the NVFP4 loader all read them; none of them owns them.
"""
