/* The demo's example program (scripts/demo.sh): a clear peak in two functions and a leak.
 *
 * load_records() holds 64 MiB and build_index() 46 MiB at the same time: the peak, about
 * 110 MiB. Both are freed before exit. parse_config() leaks 100 blocks of 1000 bytes
 * (100,000 bytes not freed at exit), and format_lines() makes many short-lived blocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1024 * 1024)

static char *config[100];

__attribute__((noinline)) static void parse_config(void) {
    for (int i = 0; i < 100; i++) {
        config[i] = malloc(1000);
        snprintf(config[i], 1000, "option-%d = %d", i, i * i);
    }
    /* Forgotten: the entries are never freed. */
}

__attribute__((noinline)) static char *load_records(void) {
    char *records = malloc(64 * MiB);
    memset(records, 'r', 64 * MiB);
    return records;
}

__attribute__((noinline)) static char *build_index(const char *records) {
    char *index = malloc(46 * MiB);
    for (size_t i = 0; i < 46 * MiB; i++) index[i] = records[i % 4096];
    return index;
}

__attribute__((noinline)) static size_t format_lines(void) {
    size_t total = 0;
    for (int i = 0; i < 10000; i++) {
        char *line = malloc(64 + i % 200);
        total += (size_t)snprintf(line, 64, "line %d", i);
        free(line);
    }
    return total;
}

int main(void) {
    parse_config();
    char *records = load_records();
    char *index = build_index(records);
    printf("records and index ready: %zu + %zu bytes\n", 64 * MiB, 46 * MiB);
    free(index);
    free(records);
    printf("formatted %zu bytes of lines\n", format_lines());
    printf("config[99] = %s\n", config[99]);
    return 0;
}
