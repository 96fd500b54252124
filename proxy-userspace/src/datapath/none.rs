//! `--proxy-mode none`: nothing is programmed; the state is only published.

use super::{changed_services, ApplyStats, Datapath, DatapathError, ProxyMode};
use crate::model::LocalState;

#[derive(Debug, Default)]
pub struct NoneDatapath;

impl Datapath for NoneDatapath {
    fn mode(&self) -> ProxyMode {
        ProxyMode::None
    }

    fn apply(&mut self, prev: &LocalState, next: &LocalState) -> Result<ApplyStats, DatapathError> {
        Ok(ApplyStats {
            services_changed: changed_services(prev, next),
        })
    }
}
