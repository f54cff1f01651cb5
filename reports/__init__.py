"""Agreement reports: versioned JSON (schema), HTML (html), the CI gate (gate), CLI and pytest plugin.

Writers use ``reports.schema``: new_report, new_device, probe_record, scan_record,
ValidationRecorder, write_report.  See docs/report-schema.md.
"""
