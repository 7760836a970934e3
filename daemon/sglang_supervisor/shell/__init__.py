"""The imperative shell: processes, HTTP, sd_notify, NVML, files and the asyncio loop around core/."""
