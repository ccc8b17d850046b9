//! Progress of a one-shot run: an `indicatif` bar with samples done / total, rate and ETA
//! when stderr is a terminal; otherwise a plain line every few seconds (and at the end), so
//! logs of batch jobs stay readable.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use chd::probe::execute::Watcher;

/// Reports progress on stderr.
pub struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    done: u64,
    /// Samples already measured before this process started (a resumed run).
    resumed: u64,
    started: Instant,
    last_line: Instant,
    every: Duration,
    message: String,
}

impl Progress {
    /// `total` samples in the run, `done` of them already measured. `interactive` draws a bar
    /// (use it when stderr is a terminal).
    pub fn new(total: u64, done: u64, interactive: bool) -> Progress {
        let bar = interactive.then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} samples, {rate}, ETA {eta} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .with_key(
                "rate",
                |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{:.1}/s", state.per_sec());
                },
            );
            bar.set_style(style);
            bar.set_position(done);
            bar.reset_eta();
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Progress {
            bar,
            total,
            done,
            resumed: done,
            started: Instant::now(),
            last_line: Instant::now(),
            every: Duration::from_secs(5),
            message: String::new(),
        }
    }

    /// Change how often plain lines are printed (tests).
    #[cfg(test)]
    pub fn with_interval(mut self, every: Duration) -> Progress {
        self.every = every;
        self
    }

    /// A short note shown after the counts (e.g. the load profile).
    pub fn set_message(&mut self, message: &str) {
        self.message = message.to_string();
        if let Some(bar) = &self.bar {
            bar.set_message(message.to_string());
        }
    }

    /// One more sample measured.
    pub fn inc(&mut self) {
        self.done += 1;
        match &self.bar {
            Some(bar) => bar.inc(1),
            None => {
                if self.last_line.elapsed() >= self.every {
                    eprintln!("{}", self.line());
                    self.last_line = Instant::now();
                }
            }
        }
    }

    /// The plain progress line: done/total, percent, rate and ETA.
    pub fn line(&self) -> String {
        let elapsed = self.started.elapsed().as_secs_f64();
        let new = self.done.saturating_sub(self.resumed);
        let rate = if elapsed > 0.0 {
            new as f64 / elapsed
        } else {
            0.0
        };
        let left = self.total.saturating_sub(self.done);
        let eta = if rate > 0.0 {
            format!("{:.0}s", left as f64 / rate)
        } else {
            "?".into()
        };
        let percent = if self.total > 0 {
            100.0 * self.done as f64 / self.total as f64
        } else {
            100.0
        };
        let mut line = format!(
            "progress: {}/{} samples ({percent:.1}%), {rate:.1}/s, ETA {eta}",
            self.done, self.total
        );
        if !self.message.is_empty() {
            line.push_str(&format!(" [{}]", self.message));
        }
        line
    }

    /// Stop drawing; prints the final plain line when not interactive.
    pub fn finish(&mut self) {
        match self.bar.take() {
            Some(bar) => {
                bar.abandon();
                // The bar leaves the cursor on its line.
                eprintln!();
            }
            None => eprintln!("{}", self.line()),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
    }
}

impl Watcher for Progress {
    fn load_started(&mut self, load: &str) {
        self.set_message(&format!("load {load}"));
    }

    fn sample_done(&mut self) {
        self.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_line_counts_resumed_samples_but_not_in_the_rate() {
        let mut p = Progress::new(10, 4, false).with_interval(Duration::from_secs(3600));
        p.set_message("load idle");
        p.inc();
        let line = p.line();
        assert!(line.starts_with("progress: 5/10 samples (50.0%)"), "{line}");
        assert!(line.ends_with("[load idle]"), "{line}");
    }
}
