"""Training-safe chat templates shipped with tmpl (``*.jinja`` with ``*.json`` metadata; see ``tmpl.templates``)."""
