/* libmwbench_hwm.so, preloaded by scripts/bench.py into every run (bare or profiled) to
 * measure a process's own peak RSS and run time, whatever runs around it: at exit it
 * appends "<pid> <comm> <VmHWM kB> <µs since its constructor>" to the file named by
 * MWBENCH_HWM_FILE. It uses only system calls (no stdio, no malloc), so it changes
 * nothing of what the profilers see. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct timespec started;

__attribute__((constructor)) static void start_clock(void) { clock_gettime(CLOCK_MONOTONIC, &started); }

static size_t slurp(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0) n = 0;
    buf[n] = '\0';
    return (size_t)n;
}

static char *decimal(char *out, unsigned long v) {
    char tmp[24];
    int n = 0;
    do tmp[n++] = (char)('0' + v % 10); while ((v /= 10) != 0);
    while (n > 0) *out++ = tmp[--n];
    return out;
}

__attribute__((destructor)) static void report_hwm(void) {
    const char *path = getenv("MWBENCH_HWM_FILE");
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    unsigned long elapsed_us = (unsigned long)((now.tv_sec - started.tv_sec) * 1000000L + (now.tv_nsec - started.tv_nsec) / 1000);
    char status[8192], comm[64], line[160];
    if (path == NULL || slurp("/proc/self/status", status, sizeof status) == 0) return;
    const char *hwm = strstr(status, "VmHWM:");
    if (hwm == NULL) return;
    unsigned long kb = strtoul(hwm + 6, NULL, 10);
    size_t comm_len = slurp("/proc/self/comm", comm, sizeof comm);
    if (comm_len > 0 && comm[comm_len - 1] == '\n') comm[--comm_len] = '\0';
    char *p = decimal(line, (unsigned long)getpid());
    *p++ = ' ';
    memcpy(p, comm, comm_len);
    p += comm_len;
    *p++ = ' ';
    p = decimal(p, kb);
    *p++ = ' ';
    p = decimal(p, elapsed_us);
    *p++ = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t written = write(fd, line, (size_t)(p - line));
    (void)written;
    close(fd);
}
