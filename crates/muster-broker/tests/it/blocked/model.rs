//! The blocked-queue against a brute-force model, on random demands and capacity changes: it
//! releases exactly what the model says fits.

use super::*;

/// The semantics in the plainest form, scanning everything, for comparison.
#[derive(Default)]
struct Model {
    blocked: BTreeMap<String, (Evaluation, Vec<Demand>)>,
    history: Vec<CapacityChange>,
}

fn fits(demands: &[Demand], change: &CapacityChange) -> bool {
    let any = [Demand::default()];
    let demands = if demands.is_empty() {
        &any[..]
    } else {
        demands
    };
    demands.iter().any(|d| {
        d.resources.fits_in(&change.free)
            && Constraint::all_admit(&d.constraints, &change.attributes)
    })
}

impl Model {
    /// (released, canceled) ids.
    fn block(&mut self, eval: Evaluation, demands: Vec<Demand>) -> (Vec<String>, Vec<String>) {
        let mut canceled = Vec::new();
        if let Some((current, _)) = self.blocked.get(&eval.job) {
            if current.id == eval.id {
            } else if (eval.create_index, eval.modify_index)
                >= (current.create_index, current.modify_index)
            {
                canceled.push(current.id.0.clone());
            } else {
                return (vec![], vec![eval.id.0]);
            }
            self.blocked.remove(&eval.job);
        }
        let missed = self
            .history
            .iter()
            .any(|c| c.index > eval.snapshot_index && fits(&demands, c));
        if missed {
            return (vec![eval.id.0], canceled);
        }
        self.blocked.insert(eval.job.clone(), (eval, demands));
        (vec![], canceled)
    }

    fn change(&mut self, change: CapacityChange) -> Vec<String> {
        let released: Vec<String> = self
            .blocked
            .iter()
            .filter(|(_, (_, demands))| fits(demands, &change))
            .map(|(job, _)| job.clone())
            .collect();
        self.history.push(change);
        released
            .into_iter()
            .filter_map(|job| self.blocked.remove(&job))
            .map(|(e, _)| e.id.0)
            .collect()
    }

    fn untrack(&mut self, job: &str) -> Vec<String> {
        self.blocked
            .remove(job)
            .map(|(e, _)| e.id.0)
            .into_iter()
            .collect()
    }
}

#[tokio::test]
async fn matches_a_brute_force_model() {
    for seed in 0..8u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (queue, mut rx) = start(BlockedConfig {
            max_history: 100_000,
            history_floor: 0,
        });
        let mut model = Model::default();
        let mut index = 0u64;
        for step in 0..1500u64 {
            let (want_released, want_canceled) = match rng.u8(0..10) {
                0..=5 => {
                    let job = format!("job-{}", rng.u8(0..40));
                    // Out-of-order create indexes and stale snapshots on purpose.
                    let create = index.saturating_sub(rng.u64(0..5));
                    let snapshot = index.saturating_sub(rng.u64(0..8));
                    let e = eval(&format!("s{seed}-e{step}"), &job, create, snapshot);
                    let demands: Vec<Demand> = (0..rng.usize(0..3))
                        .map(|_| random_demand(&mut rng))
                        .collect();
                    tell(&queue, blocked(e.clone(), demands.clone()));
                    model.block(e, demands)
                }
                6..=8 => {
                    index += 1;
                    let c = random_change(&mut rng, index);
                    tell(&queue, BlockedMsg::CapacityChanged(c.clone()));
                    (model.change(c), vec![])
                }
                _ => {
                    let job = format!("job-{}", rng.u8(0..40));
                    tell(&queue, BlockedMsg::Untrack(job.clone()));
                    (vec![], model.untrack(&job))
                }
            };
            let s = stats(&queue).await;
            let released = batches(&mut rx.unblocked);
            let canceled = batches(&mut rx.canceled);
            assert!(
                released.len() <= 1 && canceled.len() <= 1,
                "seed {seed} step {step}"
            );
            assert_eq!(
                ids(&released),
                want_released.into_iter().collect(),
                "released, seed {seed} step {step}"
            );
            assert_eq!(
                ids(&canceled),
                want_canceled.into_iter().collect(),
                "canceled, seed {seed} step {step}"
            );
            assert_eq!(
                s.total_blocked,
                model.blocked.len(),
                "seed {seed} step {step}"
            );
        }
        let want: BTreeSet<String> = model
            .blocked
            .values()
            .map(|(e, _)| e.id.0.clone())
            .collect();
        assert_eq!(blocked_ids(&queue).await, want, "seed {seed}");
    }
}
