//! Which step runs next: a fixed list (step values × repeats × sides, A and B interleaved; a
//! grid one configuration at a time), or, with `--slo`, a search per side whose next step
//! value depends on whether the last one met the SLOs.

use crate::analysis::value_met;
use crate::args::{Axis, SweepConfig};
use crate::slo::Search;
use crate::step::StepResult;

/// One planned step.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub value_index: usize,
    pub repeat: usize,
    pub side: usize,
}

/// The steps of a sweep, handed out one at a time.
pub(super) enum Planner {
    /// Every step known up front.
    Fixed { plan: Vec<Plan>, at: usize },
    /// An SLO search on each side in turn.
    Search {
        /// Searches per side, in side order.
        searches: Vec<Search>,
        /// The side being searched.
        at: usize,
        /// The value being measured on it and the repeats done.
        current: Option<(usize, usize)>,
        repeats: usize,
    },
}

impl Planner {
    pub(super) fn new(cfg: &SweepConfig) -> Planner {
        let repeats = cfg.args.repeat;
        if cfg.search {
            let searches = cfg
                .sides
                .iter()
                .map(|s| {
                    let listed = s.steps.iter().map(|&i| cfg.axis.value(i)).collect();
                    Search::new(listed, matches!(cfg.axis, Axis::Concurrency(_)), cfg.args.slo_rate_tolerance)
                })
                .collect();
            return Planner::Search { searches, at: 0, current: None, repeats };
        }
        let mut plan = vec![];
        if cfg.grid {
            for (side, s) in cfg.sides.iter().enumerate() {
                for &value_index in &s.steps {
                    plan.extend((0..repeats).map(|repeat| Plan { value_index, repeat, side }));
                }
            }
        } else {
            for value_index in 0..cfg.axis.len() {
                for repeat in 0..repeats {
                    for side in 0..cfg.sides.len() {
                        plan.push(Plan { value_index, repeat, side });
                    }
                }
            }
        }
        Planner::Fixed { plan, at: 0 }
    }

    /// The number of steps planned, when known up front.
    pub(super) fn planned(&self) -> Option<usize> {
        match self {
            Planner::Fixed { plan, .. } => Some(plan.len()),
            Planner::Search { .. } => None,
        }
    }

    /// The next step; `cfg`'s axis gains the values a search bisects to. `steps` are the
    /// steps recorded so far (a search reads its last value's outcome there).
    pub(super) fn next(&mut self, cfg: &mut SweepConfig, steps: &[StepResult]) -> Option<Plan> {
        match self {
            Planner::Fixed { plan, at } => {
                let p = plan.get(*at).copied();
                *at += 1;
                p
            }
            Planner::Search { searches, at, current, repeats } => loop {
                let search = searches.get_mut(*at)?;
                if let Some((vi, done)) = *current {
                    if done < *repeats {
                        *current = Some((vi, done + 1));
                        return Some(Plan { value_index: vi, repeat: done, side: *at });
                    }
                    *current = None;
                    match value_met(steps, &cfg.sides[*at].label, vi) {
                        Some(met) => search.record(cfg.axis.value(vi), met),
                        // Nothing judged there (skipped, interrupted): the search stops.
                        None => search.end(),
                    }
                }
                match search.next() {
                    Some(v) => {
                        let vi = cfg.axis.index_or_push(v);
                        *current = Some((vi, 1));
                        return Some(Plan { value_index: vi, repeat: 0, side: *at });
                    }
                    None => *at += 1,
                }
            },
        }
    }

    /// Ends side `side`'s search (its server is stopped for good, or the sweep is stopping);
    /// a fixed plan goes on (its remaining steps are recorded as skipped).
    pub(super) fn end_side(&mut self, side: usize) {
        if let Planner::Search { searches, at, current, .. } = self {
            if let Some(s) = searches.get_mut(side) {
                s.end();
            }
            if *at == side {
                *current = None;
            }
        }
    }
}
