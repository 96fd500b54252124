//! Turning changes into map writes: plan, capacity check, write, collect
//! backends no slot uses any more, hand removed backends to socket
//! destruction.
//!
//! A full sync of a large cluster, and a partial one that changes as many
//! services (every pod rotated), is written in chunks of
//! [`SERVICES_PER_CHUNK`] services, each planned and written on its own, so the
//! ops and batch buffers in memory at once are a chunk's, not the
//! cluster's (at 50k services / 250k endpoints one plan is ~550k ops and
//! ~40 MB). Every chunk writes whole services (the plan's ordering rules
//! hold inside it) and backends are only collected after the last chunk,
//! so a backend a later chunk still uses is never deleted. The capacity
//! check is made once, up front, on a bound of the whole sync; a sync that
//! might not fit takes the single-plan path, whose exact check refuses it
//! before its first write.

use std::borrow::Borrow;
use std::sync::Arc;

use hashbrown::HashSet;

use super::codec::Vip;
use super::desired::{self, DesiredService};
use super::plan::{self, Change, PlanProblem};
use super::{ctflush, maps, sockdestroy, EbpfDatapath, EbpfError};
use crate::datapath::{ApplyStats, ServiceChange};
use crate::model::claims::Claims;
use crate::model::{LocalState, ServiceEndpoints};

/// Services planned and written together in a chunked sync: a few MB
/// of desired services and ops, and still long runs for the kernel's batch
/// calls.
pub(super) const SERVICES_PER_CHUNK: usize = 4_096;

/// Chunks of desired services computed ahead of the one being written.
const CHUNKS_AHEAD: usize = 1;

/// The backends the big VIPs' slots were last written from
/// ([`plan::LastWritten`]), valid while the view has changed only by this
/// datapath's own writes since: a view read back from the kernel (a drift
/// check, a relink) or a failed write leaves them behind, and they are
/// dropped at the next plan.
#[derive(Default)]
pub(super) struct WrittenFrom {
    /// `EbpfDatapath::view_gen` that `backends` describe.
    gen: u64,
    backends: plan::LastWritten,
}

impl WrittenFrom {
    /// What the view at `view_gen` was written from (empty when the view
    /// changed otherwise).
    fn at(&mut self, view_gen: u64) -> &plan::LastWritten {
        if self.gen != view_gen {
            self.backends.clear();
            self.gen = view_gen;
        }
        &self.backends
    }

    /// The view went from `before` to `after` by writes of ours.
    fn advance(&mut self, before: u64, after: u64) {
        if self.gen == before {
            self.gen = after;
        }
    }

    /// `d` was written to the view at `view_gen`: kept when it is big.
    fn record(&mut self, view_gen: u64, d: DesiredService) {
        if self.gen == view_gen && d.backends.len() >= plan::PATCH_MIN_BACKENDS {
            self.backends.insert(d.vip, d.backends);
        }
    }
}

/// What the last plan cost: map writes, and backend addresses looked up
/// to make them (see [`plan::Plan::backends_looked_up`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanCost {
    pub ops: usize,
    pub backends_looked_up: usize,
}

impl EbpfDatapath {
    /// What the last plan (of the last apply's last chunk) cost.
    pub fn last_plan(&self) -> PlanCost {
        self.last_plan
    }
}

/// What one plan wrote, and the first service it could not program.
#[derive(Default)]
struct Written {
    services_changed: usize,
    problem: Option<PlanProblem>,
}

impl Written {
    fn add(&mut self, other: Written) {
        self.services_changed += other.services_changed;
        self.problem = self.problem.take().or(other.problem);
    }

    fn into_result(self) -> Result<ApplyStats, EbpfError> {
        match self.problem {
            Some(PlanProblem::TooManyBackends { vip, count }) => Err(EbpfError::TooManyBackends {
                vip,
                count,
                max: proxy_common::MAX_BACKENDS_PER_SERVICE,
            }),
            None => Ok(ApplyStats {
                services_changed: self.services_changed,
            }),
        }
    }
}

impl EbpfDatapath {
    /// One plan for all `changes`, then backends no slot uses any more.
    pub(super) fn apply_changes(
        &mut self,
        changes: Vec<Change<'_>>,
    ) -> Result<ApplyStats, EbpfError> {
        let list_pairs = self.lists_socket_pairs();
        let written = self.write_changes(changes, list_pairs)?;
        self.collect_backends()?;
        written.into_result()
    }

    /// A full sync: every VIP `next` owns written, VIPs in the maps that
    /// it does not have removed first. Returns the VIPs written.
    pub(super) fn apply_full(
        &mut self,
        next: &LocalState,
        claims: &Claims,
    ) -> Result<(ApplyStats, HashSet<Vip>), EbpfError> {
        if next.services.len() > SERVICES_PER_CHUNK {
            let chunked = self.write_chunked(
                &next.services,
                claims,
                |dp, wanted| dp.stale(wanted),
                |dp| dp.owned.clear(),
            )?;
            if let Some(done) = chunked {
                return Ok(done);
            }
        }
        let desired = desired::desired_of(&next.services, claims, &self.node_ips);
        self.apply_one_plan(desired)
    }

    /// A partial sync of the `changed` services (`next` of each, `None`
    /// when it is gone): the VIPs they owned and no longer upsert are
    /// removed first, a VIP that another of them now owns is overwritten.
    pub(super) fn apply_partial(
        &mut self,
        changed: &[ServiceChange<'_>],
        claims: &Claims,
    ) -> Result<ApplyStats, EbpfError> {
        let services: Vec<&ServiceEndpoints> = changed.iter().filter_map(|c| c.next).collect();
        let removals_of = |dp: &Self, upserted: &HashSet<Vip>| -> Vec<Vip> {
            let owned = changed.iter().filter_map(|c| dp.owned.get(c.key));
            let mut gone: Vec<Vip> = owned
                .flatten()
                .filter(|vip| !upserted.contains(*vip))
                .copied()
                .collect();
            gone.sort_unstable();
            gone.dedup();
            gone
        };
        let disown = |dp: &mut Self| {
            for c in changed {
                dp.owned.remove(c.key);
            }
        };
        if services.len() > SERVICES_PER_CHUNK {
            if let Some((stats, _)) = self.write_chunked(&services, claims, removals_of, disown)? {
                return Ok(stats);
            }
        }
        let desired = desired::desired_of(&services, claims, &self.node_ips);
        let upserted: HashSet<Vip> = desired.iter().map(|d| d.vip).collect();
        let changes = removals_of(self, &upserted)
            .into_iter()
            .map(Change::Remove)
            .chain(desired.iter().map(Change::Upsert))
            .collect();
        disown(self);
        let stats = self.apply_changes(changes)?;
        desired.iter().for_each(|d| self.own(d));
        self.record(desired);
        Ok(stats)
    }

    /// Keeps what the big VIPs of `desired`, just written, were written
    /// from.
    fn record(&mut self, desired: Vec<DesiredService>) {
        for d in desired {
            self.written_from.record(self.view_gen, d);
        }
    }

    /// Writes the VIPs `services` own a chunk at a time, after the
    /// removals that `removals_of` picks given every VIP they upsert, and
    /// collects the backends no slot uses any more. `disown` forgets the
    /// VIPs the services owned before. `None` (nothing written) when a
    /// bound of the entries might not fit the maps: the caller takes the
    /// single-plan path, whose exact check refuses it before its first
    /// write. Returns the VIPs written.
    ///
    /// A first pass computes the desired services a chunk at a time to
    /// learn which VIPs are upserted and a bound of the entries the sync
    /// can reach; the second pass computes and writes them again a chunk
    /// at a time, so neither all desired services nor all ops are ever in
    /// memory together.
    ///
    /// Both passes use the second core: the first splits the chunks
    /// between two threads, and in the second a thread computes the next
    /// chunk's desired services while this one plans and writes the
    /// current chunk (at most [`CHUNKS_AHEAD`] chunks wait).
    fn write_chunked<S: Borrow<ServiceEndpoints> + Sync>(
        &mut self,
        services: &[S],
        claims: &Claims,
        removals_of: impl FnOnce(&Self, &HashSet<Vip>) -> Vec<Vip>,
        disown: impl FnOnce(&mut Self),
    ) -> Result<Option<(ApplyStats, HashSet<Vip>)>, EbpfError> {
        let node_ips = self.node_ips.clone();
        let desired_of = |part: &[S]| desired::desired_of(part, claims, &node_ips);
        let parts: Vec<&[S]> = services.chunks(SERVICES_PER_CHUNK).collect();
        let (upserted, mut bound) = self.first_pass(&parts, &desired_of);
        let removals = removals_of(self, &upserted);
        bound.removals(&removals);
        if self.maps.capacity.overflow(&bound.peak()).is_some() {
            return Ok(None);
        }
        let new_backends = bound.new_backends();
        // Only a hint: skipped while a drift check holds the view (a copy
        // is made by the first write instead).
        if let Some(view) = Arc::get_mut(&mut self.view) {
            view.reserve(upserted.len(), new_backends);
        }
        disown(self);
        // Decided once: after the first chunk the view is not empty any
        // more, but a first start still has no pairs to destroy.
        let list_pairs = self.lists_socket_pairs();
        let removals = removals.into_iter().map(Change::Remove).collect();
        let mut written = self.write_changes(removals, list_pairs)?;
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel(CHUNKS_AHEAD);
            let parts = &parts;
            let desired_of = &desired_of;
            // Ends when its chunks are done or when the receiver is gone
            // (a write failed).
            scope.spawn(move || {
                for part in parts {
                    if tx.send(desired_of(part)).is_err() {
                        return;
                    }
                }
            });
            for desired in rx {
                let upserts = desired.iter().map(Change::Upsert).collect();
                written.add(self.write_changes(upserts, list_pairs)?);
                desired.iter().for_each(|d| self.own(d));
                self.record(desired);
            }
            Ok::<_, EbpfError>(())
        })?;
        self.collect_backends()?;
        Ok(Some((written.into_result()?, upserted)))
    }

    /// The first pass of a chunked sync, its chunks split between this
    /// thread and another: the VIPs upserted and a bound of the entries
    /// (without the removals).
    fn first_pass<'p, S: Sync>(
        &self,
        parts: &[&'p [S]],
        desired_of: &(dyn Fn(&'p [S]) -> Vec<DesiredService> + Sync),
    ) -> (HashSet<Vip>, plan::PeakBound<'_>) {
        let view = &self.view;
        let half = |parts: &[&'p [S]]| {
            let mut wanted = HashSet::new();
            let mut bound = plan::PeakBound::new(view);
            for part in parts {
                let desired = desired_of(part);
                wanted.extend(desired.iter().map(|d| d.vip));
                bound.upserts(&desired);
            }
            (wanted, bound)
        };
        let (mine, theirs) = parts.split_at(parts.len() / 2);
        std::thread::scope(|scope| {
            let other = scope.spawn(|| half(theirs));
            let (mut wanted, mut bound) = half(mine);
            // `half` panics only on a bug: pass it on.
            let (w, b) = other
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            wanted.extend(w);
            bound.merge(&b);
            (wanted, bound)
        })
    }

    /// `desired` in one plan, VIPs in the maps it does not have removed
    /// first. Returns the VIPs written.
    fn apply_one_plan(
        &mut self,
        desired: Vec<DesiredService>,
    ) -> Result<(ApplyStats, HashSet<Vip>), EbpfError> {
        let wanted: HashSet<Vip> = desired.iter().map(|d| d.vip).collect();
        let changes = self
            .stale(&wanted)
            .into_iter()
            .map(Change::Remove)
            .chain(desired.iter().map(Change::Upsert))
            .collect();
        self.owned.clear();
        let stats = self.apply_changes(changes)?;
        desired.iter().for_each(|d| self.own(d));
        self.record(desired);
        Ok((stats, wanted))
    }

    /// The VIPs in the maps that `wanted` does not have, sorted.
    fn stale(&self, wanted: &HashSet<Vip>) -> Vec<Vip> {
        let mut stale: Vec<Vip> = self
            .view
            .services()
            .map(|(vip, _)| *vip)
            .filter(|vip| !wanted.contains(vip))
            .collect();
        stale.sort_unstable();
        stale
    }

    /// Socket destruction needs the (VIP, backend) pairs a plan removes
    /// and adds; filling empty maps (the first start) removes nothing, and
    /// listing the 250,000 pairs it adds would only cancel pending
    /// destroys.
    fn lists_socket_pairs(&self) -> bool {
        self.sock_destroyer
            .as_ref()
            .is_some_and(|d| self.view.service_entry_count() > 0 || d.has_pending())
    }

    /// Plans `changes` against the view, refuses a plan that would
    /// overflow a map before its first write, writes it and hands the
    /// removed pairs to socket destruction. Source ranges are written
    /// before the headers that ask for them and removed after the headers
    /// stopped asking.
    fn write_changes(
        &mut self,
        changes: Vec<Change<'_>>,
        list_pairs: bool,
    ) -> Result<Written, EbpfError> {
        let mut ranges_after: Vec<(Vip, Vec<crate::net::Cidr>)> = Vec::new();
        let mut ranges_before: Vec<(Vip, &[crate::net::Cidr])> = Vec::new();
        for c in &changes {
            match c {
                Change::Upsert(d) => {
                    // One trie entry serves both scopes of a VIP: the
                    // external frontend's.
                    let keep = match d.vip.scope {
                        super::codec::Scope::External => d.source_ranges.as_deref().unwrap_or(&[]),
                        super::codec::Scope::Socket => &[],
                    };
                    ranges_before.push((d.vip, keep));
                    ranges_after.push((d.vip, keep.to_vec()));
                }
                Change::Remove(vip) => ranges_after.push((*vip, Vec::new())),
            }
        }
        let started = std::time::Instant::now();
        self.ext.add_ranges(ranges_before)?;
        let drained = self.draining.update(&changes);
        let stale_flows = ctflush::StaleFlows::of(&self.view, &changes);
        let before = self.view_gen;
        let plan = plan::plan_from(&self.view, changes, self.written_from.at(before));
        // Planned from; what they are written from now is recorded by
        // the caller once the write succeeded.
        for (vip, _) in &ranges_after {
            self.written_from.backends.remove(vip);
        }
        let planned = started.elapsed();
        self.check_fits(&plan.ops)?;
        let pairs = list_pairs.then(|| sockdestroy::removed_and_added(&self.view, &plan.ops));
        let listed = started.elapsed();
        if !plan.ops.is_empty() {
            self.view_gen += 1;
            maps::execute(&plan.ops, Arc::make_mut(&mut self.view), &mut self.maps)?;
        }
        self.written_from.advance(before, self.view_gen);
        let written = started.elapsed();
        if !stale_flows.is_empty() {
            match stale_flows.flush(&self.root) {
                Ok(0) => {}
                Ok(flows) => tracing::debug!(flows, "stale node-external flows flushed"),
                // The maps are written; a flow left behind keeps its old
                // backend until it idles out.
                Err(e) => tracing::warn!(error = %e, "flushing stale node-external flows"),
            }
        }
        for (vip, keep) in &ranges_after {
            self.ext.trim_ranges(vip, keep)?;
        }
        if let (Some(d), Some((mut removed, added))) = (&self.sock_destroyer, pairs) {
            removed.retain(|p| !self.draining.keeps(p));
            removed.extend(drained);
            d.submit(removed, &added);
        }
        tracing::debug!(
            vips_changed = plan.vips_changed,
            ops = plan.ops.len(),
            backends_looked_up = plan.backends_looked_up,
            service_entries = self.view.service_entry_count(),
            backends = self.view.backend_count(),
            plan_ms = planned.as_secs_f64() * 1e3,
            socket_pairs_ms = (listed - planned).as_secs_f64() * 1e3,
            write_ms = (written - listed).as_secs_f64() * 1e3,
            total_ms = started.elapsed().as_secs_f64() * 1e3,
            "eBPF maps updated"
        );
        self.last_plan = PlanCost {
            ops: plan.ops.len(),
            backends_looked_up: plan.backends_looked_up,
        };
        Ok(Written {
            services_changed: plan.vips_changed,
            problem: plan.problems.into_iter().next(),
        })
    }

    /// Deletes the backends no slot refers to any more.
    fn collect_backends(&mut self) -> Result<(), EbpfError> {
        let gc = plan::plan_gc(&self.view);
        if !gc.is_empty() {
            let before = self.view_gen;
            self.view_gen += 1;
            maps::execute(&gc, Arc::make_mut(&mut self.view), &mut self.maps)?;
            self.written_from.advance(before, self.view_gen);
        }
        Ok(())
    }

    /// Refuses a plan that would overflow a map, before its first write.
    fn check_fits(&self, ops: &[plan::Op]) -> Result<(), EbpfError> {
        let peak = plan::peak(&self.view, ops);
        match self.maps.capacity.overflow(&peak) {
            Some((map, needed, capacity)) => {
                self.metrics.full.with_label_values(&[map]).inc();
                Err(EbpfError::MapFull {
                    map,
                    capacity,
                    needed: Some(needed),
                })
            }
            None => Ok(()),
        }
    }
}
