//! The folder a run on data files saves into when no `--out` is given: `runs/<date>-<time>/`
//! (UTC) in the current folder, with `-2`, `-3`, ... when a run that started the same second
//! took the name already.

use crate::CliResult;
use std::path::{Path, PathBuf};

/// The folder, under the current one, that holds the runs saved without `--out`.
pub(super) const RUNS: &str = "runs";

/// Creates and returns a new folder `root/<stamp>` (`root` created if missing), or
/// `root/<stamp>-2`, `-3`, ... when that name is taken: each name is taken by creating it, so
/// two runs that start in the same second never share one.
pub(super) fn reserve_run_dir(root: &Path, stamp: &str) -> CliResult<PathBuf> {
    std::fs::create_dir_all(root).map_err(|e| {
        format!(
            "cannot create the runs folder {}: {e} (give --out DIR)",
            root.display()
        )
    })?;
    for i in 1..10_000u32 {
        let dir = match i {
            1 => root.join(stamp),
            i => root.join(format!("{stamp}-{i}")),
        };
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(format!(
                    "cannot create the run folder {}: {e} (give --out DIR)",
                    dir.display()
                )
                .into());
            }
        }
    }
    Err(format!(
        "{} holds 9999 runs named {stamp}: give --out DIR",
        root.display()
    )
    .into())
}

/// The name a run started at `secs` seconds since the Unix epoch gets: `YYYY-MM-DD-HHMMSS`, UTC.
pub(super) fn utc_stamp(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days to a civil date (H. Hinnant's `civil_from_days`): eras of 400 years from 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}-{:02}{:02}{:02}",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

/// A new folder for this run under [`RUNS`], named by the time now (UTC).
pub(super) fn new_run_dir() -> CliResult<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    reserve_run_dir(Path::new(RUNS), &utc_stamp(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_utc_dates_and_times() {
        assert_eq!(utc_stamp(0), "1970-01-01-000000");
        assert_eq!(utc_stamp(951_782_400), "2000-02-29-000000");
        assert_eq!(utc_stamp(1_709_251_199), "2024-02-29-235959");
        assert_eq!(utc_stamp(1_735_689_600 + 3_723), "2025-01-01-010203");
    }

    /// Two runs that start in the same second get two folders.
    #[test]
    fn runs_of_the_same_second_get_their_own_folders() {
        let root = std::env::temp_dir().join(format!("duet-runs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let a = reserve_run_dir(&root, "2025-01-01-010203").unwrap();
        let b = reserve_run_dir(&root, "2025-01-01-010203").unwrap();
        let c = reserve_run_dir(&root, "2025-01-01-010203").unwrap();
        assert_eq!(a, root.join("2025-01-01-010203"));
        assert_eq!(b, root.join("2025-01-01-010203-2"));
        assert_eq!(c, root.join("2025-01-01-010203-3"));
        assert!(a.is_dir() && b.is_dir() && c.is_dir());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
