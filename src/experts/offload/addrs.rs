//! Where a layer's experts lie, by address (store, slots, staging).
use super::*;

/// Where one matrix of one layer's experts lies, by address: the host store, the slot tensor
/// (0 without slots), the staging tensor; and the bytes of one expert.
#[derive(Debug, Clone, Copy)]
pub(super) struct MatAddrs {
    pub(super) store: usize,
    pub(super) slots: usize,
    pub(super) staging: usize,
    pub(super) expert_bytes: usize,
}

impl MatAddrs {
    /// Expert `e` in the host store.
    pub(super) fn in_store(&self, e: u32) -> usize {
        self.store + e as usize * self.expert_bytes
    }

    /// Slot `s` in the slot tensor.
    pub(super) fn in_slot(&self, s: u32) -> usize {
        self.slots + s as usize * self.expert_bytes
    }

    /// Expert `e`'s place in the staging tensor.
    pub(super) fn in_staging(&self, e: u32) -> usize {
        self.staging + e as usize * self.expert_bytes
    }
}

/// A layer's [`MatAddrs`] per matrix; `None` for a matrix the model lacks.
pub(super) struct LayerAddrs(pub(super) [Option<MatAddrs>; 3]);

impl LayerAddrs {
    /// The matrices the layer has, in [`ExpertMat::ALL`]'s order.
    pub(super) fn mats(&self) -> impl Iterator<Item = (ExpertMat, MatAddrs)> + '_ {
        ExpertMat::ALL
            .into_iter()
            .filter_map(|m| self.0[m.index()].map(|a| (m, a)))
    }

    /// Bytes of one expert, every matrix together.
    pub(super) fn expert_bytes(&self) -> u64 {
        self.mats().map(|(_, a)| a.expert_bytes as u64).sum()
    }
}

impl Offload {
    /// Per matrix of layer `il`, where its experts lie (the slots of share 0).
    pub(super) fn addrs(&self, il: usize) -> LayerAddrs {
        self.addrs_of(il, 0)
    }

    /// Per matrix of layer `il`, where its experts lie, with the slots of share `s`.
    pub(super) fn addrs_of(&self, il: usize, s: usize) -> LayerAddrs {
        let layer = self.layers[il].as_ref().expect("offloaded layer");
        LayerAddrs(ExpertMat::ALL.map(|m| {
            let mat = layer.mats[m.index()].as_ref()?;
            Some(MatAddrs {
                store: self.store_tensor(il, m)?.data_addr(),
                slots: self.slot_tensor(il, m, s).map_or(0, |t| t.data_addr()),
                staging: self.staging_tensor(il, m)?.data_addr(),
                expert_bytes: mat.expert_bytes,
            })
        }))
    }
}
