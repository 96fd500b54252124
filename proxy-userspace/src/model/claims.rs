//! Which service owns each frontend address, decided once for every
//! datapath.
//!
//! A frontend is an (IP, protocol, port) a service asks the node to answer
//! on: its ClusterIPs, externalIPs and LoadBalancer ingress IPs on each
//! service port, and its NodePorts (on every node address, so the IP is
//! [`FrontendIp::NodePort`]). The API server keeps ClusterIPs and NodePorts
//! unique, so in practice two services collide on an externalIP or an LB
//! IP (any controller may write them), or on an externalIP equal to another
//! service's ClusterIP.
//!
//! The rule: **the oldest service wins** (smallest `creationTimestamp`; a
//! service without one counts as newest), ties broken by namespace, then
//! name. The others lose that frontend only, keep their other frontends,
//! and get it when the owner goes away or drops it: [`Claims::update`]
//! names the services whose owned set changed, so the apply coordinator
//! reprograms them within the same sync.

use std::collections::BTreeSet;
use std::net::IpAddr;

// foldhash (randomly seeded), not SipHash: these tables take every
// object of a large cluster and their keys are short.
use hashbrown::HashMap;
use smallvec::SmallVec;

use super::cluster::{ObjectKey, Protocol};
use super::local::{LocalService, LocalState};

/// Where a frontend listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrontendIp {
    /// A ClusterIP, externalIP or LoadBalancer ingress IP.
    Ip(IpAddr),
    /// A NodePort, on every node address the datapath serves them on.
    NodePort,
}

/// One (IP, protocol, port) a service asks the node to answer on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Frontend {
    pub ip: FrontendIp,
    pub protocol: Protocol,
    pub port: u16,
}

impl std::fmt::Display for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = self.protocol.as_str();
        match self.ip {
            FrontendIp::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}/{proto}", self.port),
            FrontendIp::Ip(ip) => write!(f, "{ip}:{}/{proto}", self.port),
            FrontendIp::NodePort => write!(f, "nodePort {}/{proto}", self.port),
        }
    }
}

/// Every frontend of `svc`, sorted, without duplicates.
pub fn frontends(svc: &LocalService) -> Vec<Frontend> {
    let ips: Vec<IpAddr> = svc
        .cluster_ips
        .iter()
        .chain(svc.external_ips.iter())
        .chain(svc.load_balancer_ips.iter())
        .collect();
    let mut out = Vec::new();
    for pm in &svc.ports {
        out.extend(ips.iter().map(|&ip| Frontend {
            ip: FrontendIp::Ip(ip),
            protocol: pm.protocol,
            port: pm.port,
        }));
        if pm.node_port != 0 {
            out.push(Frontend {
                ip: FrontendIp::NodePort,
                protocol: pm.protocol,
                port: pm.node_port,
            });
        }
    }
    out.sort_unstable();
    out.dedup();
    // Kept per service for as long as it exists (inline when it fits).
    out.shrink_to_fit();
    out
}

/// A service in the order that decides ownership (first wins).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Claimant {
    /// `(false, t)` for a creationTimestamp `t` (Unix seconds), `(true, 0)`
    /// without one, so that unknown ages sort after every known one.
    age: (bool, i64),
    pub key: ObjectKey,
}

impl Claimant {
    pub fn of(svc: &LocalService) -> Self {
        Self {
            age: match svc.created {
                Some(t) => (false, t),
                None => (true, 0),
            },
            key: svc.key.clone(),
        }
    }
}

/// A frontend more than one service claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub frontend: Frontend,
    pub owner: ObjectKey,
    /// In claim order.
    pub losers: Vec<ObjectKey>,
}

/// The claims of every service of a state, kept up to date change by
/// change.
#[derive(Clone, Debug, Default)]
pub struct Claims {
    /// Claimants per frontend, sorted, each once; the first one owns it.
    /// A sorted list, not a set, with room for one inline: almost every
    /// frontend has one claimant (a heap block for it, or a set's first
    /// node, 50,000 times over, cost more than the claims).
    claimants: HashMap<Frontend, SmallVec<[Claimant; 1]>>,
    /// What each service claims (most services: one frontend, inline).
    by_service: HashMap<ObjectKey, (Claimant, SmallVec<[Frontend; 1]>)>,
    /// Claims that lost to another service, kept as claims change.
    lost: usize,
}

impl Claims {
    /// The claims of every service of `state`.
    pub fn of(state: &LocalState) -> Self {
        // Sized up front (a frontend or more per service): growing two
        // tables of 50,000 by doubling holds the old and the new at once.
        let mut claims = Claims {
            claimants: HashMap::with_capacity(state.services.len()),
            by_service: HashMap::with_capacity(state.services.len()),
            lost: 0,
        };
        for se in &state.services {
            claims.update(&se.service.key, Some(&se.service));
        }
        claims
    }

    /// Replaces what `key` claims with the frontends of `next` (`None`:
    /// the service is gone). Returns the *other* services whose owned
    /// frontends changed: they won or lost one.
    pub fn update(&mut self, key: &ObjectKey, next: Option<&LocalService>) -> BTreeSet<ObjectKey> {
        let mut touched = BTreeSet::new();
        let owners_before = |claims: &Claims, fs: &[Frontend]| -> Vec<Option<ObjectKey>> {
            fs.iter().map(|f| claims.owner(f).cloned()).collect()
        };
        let old = self.by_service.remove(key);
        let new = next.map(|svc| (Claimant::of(svc), SmallVec::from_vec(frontends(svc))));
        let mut affected: Vec<Frontend> = Vec::new();
        if let Some((_, fs)) = &old {
            affected.extend(fs);
        }
        if let Some((_, fs)) = &new {
            affected.extend(fs);
        }
        affected.sort_unstable();
        affected.dedup();
        let before = owners_before(self, &affected);
        let lost_here = |claims: &Claims| -> usize {
            affected
                .iter()
                .filter_map(|f| claims.claimants.get(f))
                .map(|set| set.len() - 1)
                .sum()
        };
        self.lost -= lost_here(self);
        if let Some((claimant, fs)) = &old {
            for f in fs {
                if let Some(set) = self.claimants.get_mut(f) {
                    if let Ok(i) = set.binary_search(claimant) {
                        set.remove(i);
                    }
                    if set.is_empty() {
                        self.claimants.remove(f);
                    }
                }
            }
        }
        if let Some((claimant, fs)) = new {
            for f in &fs {
                let set = self.claimants.entry(*f).or_default();
                if let Err(i) = set.binary_search(&claimant) {
                    set.insert(i, claimant.clone());
                }
            }
            self.by_service.insert(key.clone(), (claimant, fs));
        }
        self.lost += lost_here(self);
        for (f, was) in affected.iter().zip(before) {
            let now = self.owner(f).cloned();
            if now != was {
                touched.extend(now.into_iter().chain(was).filter(|k| k != key));
            }
        }
        touched
    }

    /// The service that owns `f`, if any claims it.
    pub fn owner(&self, f: &Frontend) -> Option<&ObjectKey> {
        self.claimants
            .get(f)
            .and_then(|set| set.first())
            .map(|c| &c.key)
    }

    /// Whether `key` owns `f` (a frontend nobody claims is nobody's).
    pub fn owns(&self, key: &ObjectKey, f: &Frontend) -> bool {
        self.owner(f) == Some(key)
    }

    /// Every contested frontend, sorted.
    pub fn conflicts(&self) -> Vec<Conflict> {
        let mut out: Vec<Conflict> = self
            .claimants
            .iter()
            .filter(|(_, set)| set.len() > 1)
            .map(|(f, set)| {
                let mut keys = set.iter().map(|c| c.key.clone());
                Conflict {
                    frontend: *f,
                    owner: keys.next().expect("more than one claimant"),
                    losers: keys.collect(),
                }
            })
            .collect();
        out.sort_unstable_by_key(|c| c.frontend);
        out
    }

    /// Claims that lost to another service (one per service and frontend).
    pub fn lost_claims(&self) -> usize {
        self.lost
    }

    /// The frontends `key` claims but another service owns, with that owner.
    pub fn losses(&self, key: &ObjectKey) -> Vec<(Frontend, &ObjectKey)> {
        let Some((_, fs)) = self.by_service.get(key) else {
            return Vec::new();
        };
        fs.iter()
            .filter_map(|f| Some((*f, self.owner(f)?)))
            .filter(|(_, owner)| *owner != key)
            .collect()
    }
}

#[cfg(test)]
#[path = "claims_tests.rs"]
mod tests;
