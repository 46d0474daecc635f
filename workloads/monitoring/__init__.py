"""The platform's metrics stack as pure functions (spec in, dict out).

``dcgm``: the DCGM exporter's counters file. ``stack``: the kube-prometheus-stack values and the
scrape objects (ServiceMonitors, PodMonitors, kube-state-metrics custom resource state).
``alerts``: the PrometheusRule groups and their runbooks. ``dashboards``: the pinned Grafana
dashboards and the ConfigMaps the Grafana sidecar loads them from.
"""
