//! Session persistence's count of the clients placed on each backend (what spreads a VIP's few
//! heavy clients by weight, see `balancer_common::schedule::spread_over`): the data plane adds
//! one at each new client's placement; the daemon ages the counts once a second, so that they
//! count the clients placed within about the VIP's persistence time.

use super::{Balancer, BalancerError, Endpoint};
use crate::dataplane::Dataplane;

impl<D: Dataplane> Balancer<D> {
    /// Once a second: each persistent VIP's backends' counts lose 1/persistence time (in
    /// seconds) of themselves. Returns the VIPs aged.
    pub fn age_homes(&mut self) -> Result<usize, BalancerError> {
        let persistent: Vec<Endpoint> = self
            .vips
            .iter()
            .filter(|(_, v)| !v.config.persistence.is_zero())
            .map(|(e, _)| *e)
            .collect();
        for vip in &persistent {
            let state = &self.vips[vip];
            let ids: Vec<u32> = state.backends.values().map(|b| b.id).collect();
            let divisor = state.config.persistence.as_secs().max(1);
            self.dataplane.age_homes(&ids, divisor)?;
        }
        Ok(persistent.len())
    }
}
