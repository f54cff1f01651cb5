"""Agreement reports, the top layer: the versioned JSON (schema, checks), building it
(records: a probe's DeviceResult -> device object; environment; store: where reports live),
the HTML page (html, model_card), the CI gate (gate), the commands (cli: the `fp4ref`
command table; probe_run: `fp4ref probe`; fleet) and the pytest plugin.

Writers use ``reports.records``: new_report, new_device, device_record, probe_record,
scan_record, write_report (validation records: probes.recorder.ValidationRecorder).
Models are written in the one notation of reference.notation.  See docs/report-schema.md.
"""
