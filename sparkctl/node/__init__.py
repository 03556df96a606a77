"""Code that runs on the nodes from sparkctl's own zip (``sparkctl.plan.exporterplan.bundle``).

Unlike ``sparkctl/remote/`` (single files, standard library only), these modules import
sparkctl's fact parsers, so the node runs the very parsers the operator's ``status`` runs,
never a second copy. They import no pydantic, PyYAML, jinja2, click or transport
(``tests/test_exporter.py`` imports them with those blocked); the exporter's one third-party
library, prometheus_client, comes as a pinned wheel (``sparkctl.model.wheels``).
"""
