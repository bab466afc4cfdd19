//! The thinking budget (Anthropic's `thinking.budget_tokens`): a request's reasoning is cut after
//! `budget` tokens by forcing the end-of-thinking tag, and the answer follows as the model goes
//! on from there. The state machine is llama.cpp's `--reasoning-budget` sampler
//! (`common/reasoning-budget.h`): idle until the opening tag (or counting from the start when the
//! template opened it), counting tokens inside the reasoning, then forcing the closing tag's
//! tokens one by one, then out of the way. A model that closes its reasoning itself within the
//! budget is never touched.

use sparrow_engine::scheduler::TokenConstraint;

/// Where the machine is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the opening tag.
    Idle,
    /// Inside the reasoning, this many tokens so far.
    Counting(usize),
    /// Forcing the closing tag: this many of its tokens forced so far.
    Forcing(usize),
    /// After the reasoning: every token allowed.
    Done,
}

/// One choice's thinking budget, as a [`TokenConstraint`] the engine applies while sampling.
#[derive(Debug, Clone)]
pub struct ThinkBudget {
    open: Vec<u32>,
    close: Vec<u32>,
    budget: usize,
    state: State,
    /// The last tokens sampled (as many as the longer tag has).
    recent: Vec<u32>,
}

impl ThinkBudget {
    /// A budget of `budget` reasoning tokens between the token sequences `open` and `close`
    /// (`<think>` and `</think>` tokenized); `inside`: the prompt already opened the reasoning.
    /// `close` must not be empty.
    pub fn new(open: Vec<u32>, close: Vec<u32>, budget: usize, inside: bool) -> ThinkBudget {
        let state = if inside { State::Counting(0) } else { State::Idle };
        ThinkBudget { open, close, budget, state, recent: Vec::new() }
    }

    fn after(&self, seq: &[u32]) -> bool {
        !seq.is_empty() && self.recent.ends_with(seq)
    }

    fn force_or_count(&self, n: usize) -> State {
        if n >= self.budget {
            State::Forcing(0)
        } else {
            State::Counting(n)
        }
    }
}

impl TokenConstraint for ThinkBudget {
    fn allowed(&mut self, allowed: &mut [bool]) -> Result<(), String> {
        match self.state {
            State::Forcing(i) => {
                let t = self.close[i] as usize;
                let slot =
                    allowed.get_mut(t).ok_or_else(|| format!("end-of-thinking token {t} is outside the vocabulary"))?;
                *slot = true;
            }
            _ => allowed.fill(true),
        }
        Ok(())
    }

    fn advance(&mut self, token: u32) -> Result<bool, String> {
        let keep = self.open.len().max(self.close.len());
        self.recent.push(token);
        if self.recent.len() > keep {
            self.recent.remove(0);
        }
        self.state = match self.state {
            State::Idle if self.after(&self.open) => self.force_or_count(0),
            State::Idle => State::Idle,
            State::Counting(_) if self.after(&self.close) => State::Done,
            State::Counting(n) => self.force_or_count(n + 1),
            State::Forcing(i) if i + 1 >= self.close.len() => State::Done,
            State::Forcing(i) => State::Forcing(i + 1),
            State::Done => State::Done,
        };
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps the machine over `model`'s wishes: each step the model wants its next token, the
    /// mask decides whether it gets it, else the only allowed token is taken.
    fn run(b: &mut ThinkBudget, model: &[u32], vocab: usize) -> Vec<u32> {
        let mut out = Vec::new();
        for &w in model {
            let mut mask = vec![false; vocab];
            b.allowed(&mut mask).expect("mask");
            let t = if mask[w as usize] { w } else { mask.iter().position(|&m| m).expect("one allowed") as u32 };
            b.advance(t).expect("advance");
            out.push(t);
        }
        out
    }

    #[test]
    fn reasoning_is_cut_at_the_budget_and_the_answer_follows() {
        // 1 = <think>, 8 9 = </think>, 5 = a reasoning token, 7 = an answer token.
        let mut b = ThinkBudget::new(vec![1], vec![8, 9], 3, false);
        let got = run(&mut b, &[7, 1, 5, 5, 5, 5, 5, 5, 7, 7], 10);
        assert_eq!(got, vec![7, 1, 5, 5, 5, 8, 9, 5, 7, 7]);
        // Closed within the budget: untouched.
        let mut b = ThinkBudget::new(vec![1], vec![8, 9], 3, false);
        assert_eq!(run(&mut b, &[1, 5, 8, 9, 7, 5, 5, 5, 5], 10), vec![1, 5, 8, 9, 7, 5, 5, 5, 5]);
        // Opened by the template: counting from the first token.
        let mut b = ThinkBudget::new(vec![1], vec![8, 9], 2, true);
        assert_eq!(run(&mut b, &[5, 5, 5, 5, 7], 10), vec![5, 5, 8, 9, 7]);
    }
}
