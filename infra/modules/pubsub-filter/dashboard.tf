# The Cloud Monitoring dashboard's tiles, derived from the same config as everything else
# (one skip-rate tile per route, shadow routes marked). Locals only, reading only
# variables, so tests can evaluate them with `terraform console` (the resource is in
# monitoring.tf).
#
# The tiles read the log-based metrics this module declares (monitoring.tf): they exist
# the moment Terraform finishes, whether or not a collector or Managed Prometheus sidecar
# scrapes /metrics. Metric names are built from var.name exactly as the metrics name
# themselves ("<name>/decisions", ...).

locals {
  dashboard_metric = {
    for m in ["decisions", "decision_latency", "lease_takeovers", "heartbeat_failures", "fail_open", "records_dropped"] :
    m => "metric.type=\"logging.googleapis.com/user/${var.name}/${m}\" AND resource.type=\"cloud_run_revision\""
  }

  dashboard_route_modes = { for r in local.config.routes : r.name => try(r.mode, "enforce") }

  # skip rate = (suppressed + duplicate + stale + noise_only + superseded) / decided, as `pubsub-filter skip-rate`
  dashboard_skip_rate_tiles = [
    for name, mode in local.dashboard_route_modes : {
      title = mode == "shadow" ? "Skip rate: ${name} (shadow: would have skipped)" : "Skip rate: ${name}"
      xyChart = {
        dataSets = [{
          plotType = "LINE"
          timeSeriesQuery = {
            timeSeriesFilterRatio = {
              numerator = {
                filter = "${local.dashboard_metric.decisions} AND metric.label.route=\"${name}\" AND metric.label.decision=one_of(\"suppressed\",\"duplicate\",\"stale\",\"noise_only\",\"superseded\")"
                aggregation = {
                  alignmentPeriod    = "300s"
                  perSeriesAligner   = "ALIGN_SUM"
                  crossSeriesReducer = "REDUCE_SUM"
                }
              }
              denominator = {
                filter = "${local.dashboard_metric.decisions} AND metric.label.route=\"${name}\" AND metric.label.decision=one_of(\"forwarded\",\"fail_open\",\"suppressed\",\"duplicate\",\"stale\",\"noise_only\",\"superseded\")"
                aggregation = {
                  alignmentPeriod    = "300s"
                  perSeriesAligner   = "ALIGN_SUM"
                  crossSeriesReducer = "REDUCE_SUM"
                }
              }
            }
          }
        }]
        yAxis = { label = "skipped / decided", scale = "LINEAR" }
      }
    }
  ]

  dashboard_latency_tile = {
    title = "Decision latency p50 / p95 (ms)"
    xyChart = {
      dataSets = [
        for p in ["50", "95"] : {
          plotType       = "LINE"
          legendTemplate = "p${p} $${metric.labels.route}"
          timeSeriesQuery = {
            timeSeriesFilter = {
              filter = local.dashboard_metric.decision_latency
              aggregation = {
                alignmentPeriod    = "60s"
                perSeriesAligner   = "ALIGN_DELTA"
                crossSeriesReducer = "REDUCE_PERCENTILE_${p}"
                groupByFields      = ["metric.label.route"]
              }
            }
          }
        }
      ]
      yAxis = { label = "ms", scale = "LINEAR" }
    }
  }

  # Counters of one kind of line: [metric, title, grouped by]
  dashboard_counter_tiles = [
    for t in [
      ["decisions", "Decisions by type", "metric.label.decision"],
      ["lease_takeovers", "Lease takeovers", "metric.label.route"],
      ["heartbeat_failures", "Heartbeat failures", "metric.label.route"],
      ["fail_open", "Fail-open forwards (store unreachable)", "metric.label.route"],
      ["records_dropped", "Decision records dropped", "metric.label.route"],
      ] : {
      title = t[1]
      xyChart = {
        dataSets = [{
          plotType = t[0] == "decisions" ? "STACKED_BAR" : "LINE"
          timeSeriesQuery = {
            timeSeriesFilter = {
              filter = local.dashboard_metric[t[0]]
              aggregation = {
                alignmentPeriod    = "300s"
                perSeriesAligner   = "ALIGN_SUM"
                crossSeriesReducer = "REDUCE_SUM"
                groupByFields      = [t[2]]
              }
            }
          }
        }]
        yAxis = { label = "per 5 min", scale = "LINEAR" }
      }
    }
  ]

  dashboard_widgets = concat(local.dashboard_skip_rate_tiles, [local.dashboard_latency_tile], local.dashboard_counter_tiles)

  # Two tiles a row on the 12-column mosaic.
  dashboard = {
    displayName = "pubsub-filter ${var.name}"
    mosaicLayout = {
      columns = 12
      tiles = [
        for i, w in local.dashboard_widgets : {
          xPos   = (i % 2) * 6
          yPos   = floor(i / 2) * 4
          width  = 6
          height = 4
          widget = w
        }
      ]
    }
  }
}
