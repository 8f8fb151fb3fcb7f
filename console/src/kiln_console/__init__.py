"""Kiln's web console: hypermedia pages (Jinja2 + htmx) over the platform's admin services."""
