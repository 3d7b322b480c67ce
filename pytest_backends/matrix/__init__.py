"""The backend matrix: configurations, markers, expansion, verification and reports."""
