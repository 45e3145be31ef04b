//! Prometheus metrics of the join service.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    kind: String,
    reason: String,
}

/// The join service's metrics: tickets issued by kind, rejections by reason, and request
/// latency by kind.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    tickets: Family<KindLabel, Counter>,
    rejections: Family<ReasonLabel, Counter>,
    latency: Family<KindLabel, Histogram>,
    atls_refusals: Family<AtlsLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AtlsLabel {
    reason: &'static str,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Fresh, zeroed metrics.
    pub fn new() -> Self {
        let tickets = Family::<KindLabel, Counter>::default();
        let rejections = Family::<ReasonLabel, Counter>::default();
        let latency = Family::<KindLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        let mut registry = Registry::default();
        registry.register(
            "asterism_join_tickets_issued",
            "Tickets issued, by kind (join, rejoin)",
            tickets.clone(),
        );
        registry.register(
            "asterism_join_rejections",
            "Requests refused, by kind and reason",
            rejections.clone(),
        );
        registry.register(
            "asterism_join_request_duration_seconds",
            "Time to answer a ticket request (issued or refused), by kind",
            latency.clone(),
        );
        let atls_refusals = Family::<AtlsLabel, Counter>::default();
        registry.register(
            "asterism_join_atls_refusals",
            "Connections refused before any request, by reason (the attested TLS exchange or \
             the listener's limits; the full reason is in the log)",
            atls_refusals.clone(),
        );
        Self {
            registry: Arc::new(registry),
            tickets,
            rejections,
            latency,
            atls_refusals,
        }
    }

    /// Counts an issued ticket.
    pub fn issued(&self, kind: &str) {
        self.tickets
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    /// Counts a refusal.
    pub fn rejected(&self, kind: &str, reason: &str) {
        self.rejections
            .get_or_create(&ReasonLabel {
                kind: kind.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts a connection the aTLS listener refused, by its fixed reason label.
    pub fn atls_refused(&self, reason: &'static str) {
        self.atls_refusals
            .get_or_create(&AtlsLabel { reason })
            .inc();
    }

    /// Records a request's duration.
    pub fn observe(&self, kind: &str, seconds: f64) {
        self.latency
            .get_or_create(&KindLabel { kind: kind.into() })
            .observe(seconds);
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atls_refusals_are_counted_by_reason() {
        let m = Metrics::new();
        m.atls_refused("silent_peer");
        m.atls_refused("silent_peer");
        m.atls_refused("rejected");
        let text = m.encode();
        assert!(
            text.contains("asterism_join_atls_refusals_total{reason=\"silent_peer\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("asterism_join_atls_refusals_total{reason=\"rejected\"} 1"),
            "{text}"
        );
    }
}
