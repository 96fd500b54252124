//! `--proxy-mode none`: nothing is programmed; the state is only published.

use super::{ApplyStats, Datapath, DatapathError, ProxyMode, ServiceChange};
use crate::model::claims::Claims;
use crate::model::LocalState;

#[derive(Debug, Default)]
pub struct NoneDatapath;

impl Datapath for NoneDatapath {
    fn mode(&self) -> ProxyMode {
        ProxyMode::None
    }

    fn dump(_: &super::DatapathConfig) -> Result<Option<super::Dump>, DatapathError> {
        Ok(None)
    }

    fn cleanup(_: &super::DatapathConfig) -> Result<Vec<String>, DatapathError> {
        Ok(Vec::new())
    }

    fn program_all(
        &mut self,
        next: &LocalState,
        _claims: &Claims,
    ) -> Result<ApplyStats, DatapathError> {
        Ok(ApplyStats {
            services_changed: next.services.len(),
        })
    }

    fn program_changes(
        &mut self,
        _prev: &LocalState,
        _next: &LocalState,
        changed: &[ServiceChange<'_>],
        _claims: &Claims,
    ) -> Result<ApplyStats, DatapathError> {
        Ok(ApplyStats {
            services_changed: changed.len(),
        })
    }
}
