/* command.h: run a shell command for a test and keep what it printed. The
 * including file defines _XOPEN_SOURCE 700 (popen) before any include. */
#ifndef TCC_TEST_COMMAND_H
#define TCC_TEST_COMMAND_H

#include <stdio.h>
#include <sys/wait.h>

/* cmd through the shell: its output (end it with 2>&1 for stderr too) in
 * out[size], NUL-terminated; its exit status, or -1 when it did not exit or
 * could not start. */
static int run_command(const char *cmd, char *out, size_t size)
{
    FILE *f = popen(cmd, "r");
    if (!f) {
        out[0] = 0;
        return -1;
    }
    size_t n = fread(out, 1, size - 1, f);
    out[n] = 0;
    int status = pclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif
