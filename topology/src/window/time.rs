//! [`TimeWindows`]: tumbling and hopping windows of a fixed size (Kafka Streams' `TimeWindows`).

use std::time::Duration;

use super::{Window, WindowError};
use crate::time::millis;

/// Fixed-size windows `[start, start + size)`, one every `advance` milliseconds from the epoch:
/// tumbling when `advance == size` (the default), hopping (overlapping) when smaller.
///
/// A record at `t` belongs to every window with `start <= t < start + size`. It updates those
/// whose end is above `stream time - grace`, and is late for the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeWindows {
    size_ms: i64,
    advance_ms: i64,
    grace_ms: i64,
}

impl TimeWindows {
    /// Tumbling windows of `size` that accept records up to `grace` after their end (Kafka
    /// Streams' `TimeWindows.ofSizeAndGrace`).
    pub fn of_size_and_grace(size: Duration, grace: Duration) -> Self {
        let size_ms = millis(size);
        TimeWindows {
            size_ms,
            advance_ms: size_ms,
            grace_ms: millis(grace),
        }
    }

    /// Tumbling windows of `size` without grace: a record is late as soon as stream time passed
    /// its window's end (`TimeWindows.ofSizeWithNoGrace`).
    pub fn of_size_with_no_grace(size: Duration) -> Self {
        Self::of_size_and_grace(size, Duration::ZERO)
    }

    /// Hopping windows: a new window every `advance`, which must lie in (0, size]
    /// (`TimeWindows.advanceBy`; checked by `build`).
    pub fn advance_by(mut self, advance: Duration) -> Self {
        self.advance_ms = millis(advance);
        self
    }

    /// The window size in ms.
    pub fn size_ms(&self) -> i64 {
        self.size_ms
    }

    /// The advance in ms.
    pub fn advance_ms(&self) -> i64 {
        self.advance_ms
    }

    /// The grace period in ms.
    pub fn grace_ms(&self) -> i64 {
        self.grace_ms
    }

    /// The windows a record at `timestamp` belongs to, by increasing start (Kafka Streams'
    /// `windowsFor`; starts are never negative).
    pub fn windows_for(&self, timestamp: i64) -> Vec<Window> {
        let (size, advance) = (self.size_ms.max(1), self.advance_ms.max(1));
        let first = (timestamp - size + advance).max(0);
        let mut start = first - first.rem_euclid(advance);
        let mut out = Vec::with_capacity((size / advance) as usize + 1);
        while start <= timestamp {
            out.push(Window::new(start, start.saturating_add(size)));
            start += advance;
        }
        out
    }

    /// The retention a store needs at least: size + grace (the default).
    pub fn minimum_retention_ms(&self) -> i64 {
        self.size_ms.saturating_add(self.grace_ms)
    }

    /// Checks size and advance.
    pub(crate) fn validate(&self) -> Result<(), WindowError> {
        if self.size_ms < 1 {
            return Err(WindowError::NotPositive {
                what: "the size of TimeWindows",
            });
        }
        if self.advance_ms < 1 || self.advance_ms > self.size_ms {
            return Err(WindowError::Advance {
                advance_ms: self.advance_ms,
                size_ms: self.size_ms,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn starts(w: &TimeWindows, t: i64) -> Vec<i64> {
        w.windows_for(t).into_iter().map(|w| w.start).collect()
    }

    #[test]
    fn a_tumbling_window_holds_its_start_and_excludes_its_end() {
        let w = TimeWindows::of_size_with_no_grace(Duration::from_millis(10));
        assert_eq!(starts(&w, 0), vec![0]);
        assert_eq!(starts(&w, 9), vec![0]);
        assert_eq!(starts(&w, 10), vec![10]);
        assert_eq!(w.windows_for(25), vec![Window::new(20, 30)]);
    }

    #[test]
    fn hopping_windows_overlap_and_never_start_before_zero() {
        let w = TimeWindows::of_size_with_no_grace(Duration::from_millis(10))
            .advance_by(Duration::from_millis(3));
        assert_eq!(starts(&w, 2), vec![0]);
        assert_eq!(starts(&w, 12), vec![3, 6, 9, 12]);
        for s in starts(&w, 12) {
            assert!(s <= 12 && 12 < s + 10);
        }
    }

    #[test]
    fn invalid_definitions_are_reported() {
        let w = TimeWindows::of_size_with_no_grace(Duration::from_millis(10));
        assert!(w.validate().is_ok());
        assert!(w.advance_by(Duration::from_millis(11)).validate().is_err());
        assert!(w.advance_by(Duration::ZERO).validate().is_err());
        assert!(TimeWindows::of_size_with_no_grace(Duration::ZERO)
            .validate()
            .is_err());
    }
}
