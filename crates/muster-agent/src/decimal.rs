//! Numbers as decimal lines, written without allocating: for the code that runs between a
//! fork and an exec (the executor writing the task's pid and wait status, a task joining its
//! cgroup, the executor's output bookkeeping), where only system calls are safe.

/// Room for any `i64` in decimal, its sign and a newline.
pub(crate) const DECIMAL_BUFFER: usize = 22;

/// `value` in decimal followed by a newline, written at the end of `buffer`, without
/// allocating: for the code between fork and exec.
pub(crate) fn decimal_line(value: i64, buffer: &mut [u8; DECIMAL_BUFFER]) -> &[u8] {
    let mut at = buffer.len() - 1;
    buffer[at] = b'\n';
    let mut rest = value.unsigned_abs();
    loop {
        at -= 1;
        buffer[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if value < 0 {
        at -= 1;
        buffer[at] = b'-';
    }
    &buffer[at..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_in_decimal_lines() {
        let mut buffer = [0u8; DECIMAL_BUFFER];
        assert_eq!(decimal_line(0, &mut buffer), b"0\n");
        assert_eq!(decimal_line(4242, &mut buffer), b"4242\n");
        assert_eq!(
            decimal_line(i64::MIN, &mut buffer),
            b"-9223372036854775808\n"
        );
    }
}
