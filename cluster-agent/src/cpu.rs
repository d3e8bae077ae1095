//! The calling thread's time on a CPU, for timing work as CPU rather than wall time:
//! on a shared, busy core the wall time of `plan` measures the scheduler as much as
//! the division (the lab times the agent's code the same way, `qos-lab`'s `agent_cpu`).

/// Nanoseconds the calling thread has run on a CPU (`/proc/thread-self/schedstat`'s
/// first field); `None` where the kernel does not give it.
pub fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Runs `f`, and returns what it returned with the wall time and the thread's CPU time
/// it took (the CPU time `None` where the kernel does not give it).
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, std::time::Duration, Option<std::time::Duration>) {
    let (wall, cpu) = (std::time::Instant::now(), thread_cpu_ns());
    let v = f();
    let took = wall.elapsed();
    let cpu = cpu
        .zip(thread_cpu_ns())
        .map(|(a, b)| std::time::Duration::from_nanos(b.saturating_sub(a)));
    (v, took, cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_work_takes_cpu_time_and_a_sleep_takes_none() {
        let Some(_) = thread_cpu_ns() else {
            return; // not Linux's /proc: nothing to check
        };
        let (sum, wall, cpu) =
            timed(|| (0..20_000_000u64).fold(0u64, |a, x| a ^ x.wrapping_mul(x)));
        std::hint::black_box(sum);
        let cpu = cpu.expect("schedstat");
        assert!(
            cpu > std::time::Duration::ZERO && cpu <= wall + std::time::Duration::from_millis(5)
        );
        let (_, wall, cpu) = timed(|| std::thread::sleep(std::time::Duration::from_millis(50)));
        assert!(wall >= std::time::Duration::from_millis(50));
        assert!(
            cpu.expect("schedstat") < std::time::Duration::from_millis(20),
            "{cpu:?}"
        );
    }
}
