//! The calling thread's time on a CPU, for timing work as CPU rather than wall time:
//! on a shared, busy core the wall time of `plan` measures the scheduler as much as
//! the division (the lab times the agent's code the same way, `qos-lab`'s `agent_cpu`).

/// Nanoseconds the calling thread has run on a CPU (`CLOCK_THREAD_CPUTIME_ID`, exact
/// to the call: `/proc/thread-self/schedstat`, read for the running thread, moves only
/// at the scheduler's tick, 4 ms here, so a 2-ms `plan` read 0 or 4 ms); `None` where
/// the kernel has no such clock.
pub fn thread_cpu_ns() -> Option<u64> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    u64::try_from(t.tv_sec)
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(u64::try_from(t.tv_nsec).ok()?)
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
    fn the_clock_moves_by_less_than_a_tick() {
        let Some(t0) = thread_cpu_ns() else {
            return;
        };
        // Spin until it moves: the first step is well under the scheduler's tick.
        let step = loop {
            let t = thread_cpu_ns().expect("clock");
            if t > t0 {
                break t - t0;
            }
        };
        assert!(step < 1_000_000, "the clock moved by {step} ns at once");
    }

    #[test]
    fn busy_work_takes_cpu_time_and_a_sleep_takes_none() {
        let Some(_) = thread_cpu_ns() else {
            return; // no thread CPU clock here: nothing to check
        };
        let (sum, wall, cpu) =
            timed(|| (0..20_000_000u64).fold(0u64, |a, x| a ^ x.wrapping_mul(x)));
        std::hint::black_box(sum);
        let cpu = cpu.expect("the thread CPU clock");
        assert!(
            cpu > std::time::Duration::ZERO && cpu <= wall + std::time::Duration::from_millis(5)
        );
        let (_, wall, cpu) = timed(|| std::thread::sleep(std::time::Duration::from_millis(50)));
        assert!(wall >= std::time::Duration::from_millis(50));
        assert!(
            cpu.expect("the thread CPU clock") < std::time::Duration::from_millis(20),
            "{cpu:?}"
        );
    }
}
