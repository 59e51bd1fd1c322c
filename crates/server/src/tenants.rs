//! Tenants' shares of the rt capacity (`[tenants.NAME] rt_share`, docs/security.md
//! "Tenants"), as the server applies them: the one place where a viewer's stream — an HLS
//! session, an RTSP session, a paced HTTP download the engine sends — is admitted in the
//! partition of its credential's tenant (a JWT's `tenant` claim), a refusal is counted for
//! that tenant, and the per-tenant gauges are set. The partitions themselves are the core's
//! (`penstock_core::admission::tenants`); this module only names the tenant and counts.

use penstock_driver::{Admitted, Engine, StreamError, StreamSpec};

use crate::metrics::{Metrics, TenantLabel};

/// Why a viewer's stream was not admitted.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The credential names a tenant the configuration does not set.
    UnknownTenant(String),
    /// The engine's admission: the tenant's share (the refusal names it), the server's
    /// capacity, or a rate the planner refuses.
    Engine(StreamError),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::UnknownTenant(t) => write!(f, "unknown tenant {t:?} (no [tenants.{t}])"),
            Refused::Engine(e) => e.fmt(f),
        }
    }
}

/// The tenant a credential names, as admission takes it: `None` when no `[tenants]` are set
/// at all (there is no partition to charge, and a claim is no metric label then); a name
/// with tenants set, even one they do not hold (which [`admit`] refuses).
pub(crate) fn named(engine: &Engine, tenant: Option<String>) -> Option<String> {
    tenant.filter(|_| !engine.tenant_usage().is_empty())
}

/// Admits `spec` (what the stream will ask when it starts; `datagram`: to a UDP socket)
/// within `tenant`'s share of the rt capacity, or within the part of no tenant (`None`). A
/// refusal of a tenant's stream is counted in `penstock_tenant_refusals_total{tenant}`; the
/// reservation is held by the returned [`Admitted`] (given back when it is dropped).
pub(crate) fn admit(
    engine: &Engine,
    metrics: &Metrics,
    spec: &StreamSpec,
    datagram: bool,
    tenant: Option<&str>,
) -> Result<Option<Admitted>, Refused> {
    let r = match tenant {
        None => engine.admit(spec, datagram).map_err(Refused::Engine),
        Some(t) => match engine.tenant_id(t) {
            None => Err(Refused::UnknownTenant(t.to_string())),
            Some(id) => engine
                .admit_for(spec, datagram, Some(id))
                .map_err(Refused::Engine),
        },
    };
    match &r {
        Ok(_) => set_gauges(engine, metrics),
        Err(_) => refused(metrics, tenant),
    }
    r
}

/// Counts a refusal of `tenant`'s stream (nothing for a stream of no tenant).
pub(crate) fn refused(metrics: &Metrics, tenant: Option<&str>) {
    if let Some(t) = tenant {
        metrics
            .tenant_refusals
            .get_or_create(&TenantLabel {
                tenant: t.to_string(),
            })
            .inc();
    }
}

/// Counts `bytes` sent to `tenant`'s viewers.
pub(crate) fn add_bytes(metrics: &Metrics, tenant: &str, bytes: u64) {
    metrics
        .tenant_bytes
        .get_or_create(&TenantLabel {
            tenant: tenant.to_string(),
        })
        .inc_by(bytes);
}

/// `penstock_tenant_sessions{tenant}`: the streams each tenant's partition holds now
/// (every protocol's), as admission counts them.
pub(crate) fn set_gauges(engine: &Engine, metrics: &Metrics) {
    for (name, _, used) in engine.tenant_usage() {
        if !name.is_empty() {
            metrics
                .tenant_sessions
                .get_or_create(&TenantLabel { tenant: name })
                .set(i64::from(used.streams));
        }
    }
}

/// The name of the tenant reservation `admitted` was made in, if any.
pub(crate) fn of(engine: &Engine, admitted: &Admitted) -> Option<String> {
    let t = admitted.reservation().tenant?;
    engine
        .tenant_usage()
        .get(usize::from(t.0))
        .map(|u| u.0.clone())
}
