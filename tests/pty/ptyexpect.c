/* ptyexpect: drives a command through a pseudo-terminal, as a person at a terminal would, for
 * the REPL's tests (tests/spec/repl_pty_spec.lua). The script comes on stdin, one step a line:
 *   send TEXT       types TEXT; escapes \n \r \t \\ \xHH (Ctrl-C is \x03, Ctrl-D \x04, Tab \t)
 *   expect TEXT     waits until TEXT appears in the output after the previous match
 *   sleep SECONDS   lets time pass (output keeps being read)
 *   timeout SECONDS the limit of each later expect and wait (default 10)
 *   wait [CODE]     waits for the command to end (with exit code CODE)
 *   # ...           a comment
 * The output is matched with terminal escape sequences and carriage returns removed. At the
 * end the whole output (so cleaned) is printed; a step that fails prints which, what the
 * command wrote since the previous match, and exits 1.
 * usage: ptyexpect -- COMMAND [ARG...] < SCRIPT */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char *out;          /* the cleaned output so far */
static size_t out_len, out_cap, matched;   /* matched: where the next expect starts */
static int esc_state;      /* 0 text, 1 after ESC, 2 inside a CSI sequence, 3 inside an OSC */

static void keep(char c) {
  if (out_len + 2 > out_cap) {
    out_cap = out_cap ? 2 * out_cap : 65536;
    out = realloc(out, out_cap);
    if (!out) { perror("ptyexpect"); exit(2); }
  }
  out[out_len++] = c;
  out[out_len] = 0;
}

/* Removes ESC [ ... final, ESC ] ... BEL, other two-byte escapes, CR and BEL. */
static void clean(const char *buf, ssize_t n) {
  for (ssize_t i = 0; i < n; i++) {
    char c = buf[i];
    switch (esc_state) {
    case 0:
      if (c == 27) esc_state = 1;
      else if (c != '\r' && c != 7) keep(c);
      break;
    case 1: esc_state = c == '[' ? 2 : c == ']' ? 3 : 0; break;
    case 2: if (c >= 0x40 && c <= 0x7e) esc_state = 0; break;
    case 3: if (c == 7) esc_state = 0; break;
    }
  }
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int master = -1;
static pid_t child;
static int child_status = -1;

/* Reads what the command writes for up to `seconds`; returns 0 at end of output. */
static int pump(double seconds) {
  struct pollfd p = { master, POLLIN, 0 };
  int r = poll(&p, 1, (int)(seconds * 1000));
  if (r <= 0) return 1;
  char buf[4096];
  ssize_t n = read(master, buf, sizeof buf);
  if (n <= 0) return 0;   /* EIO once the command and its children closed the terminal */
  clean(buf, n);
  return 1;
}

/* Decodes the escapes of TEXT in place; returns its length. */
static size_t unescape(char *s) {
  char *w = s;
  for (char *r = s; *r; r++) {
    if (*r != '\\' || !r[1]) { *w++ = *r; continue; }
    r++;
    switch (*r) {
    case 'n': *w++ = '\n'; break;
    case 'r': *w++ = '\r'; break;
    case 't': *w++ = '\t'; break;
    case 'x': { unsigned v = 0; int k = 0;
                while (k < 2 && r[1] && strchr("0123456789abcdefABCDEF", r[1])) { char h = *++r; v = v * 16 + (h <= '9' ? h - '0' : (h | 32) - 'a' + 10); k++; }
                *w++ = (char)v; break; }
    default: *w++ = *r;
    }
  }
  *w = 0;
  return (size_t)(w - s);
}

static void fail(int line, const char *what) {
  printf("%s", out ? out : "");
  printf("\nptyexpect: script line %d: %s\nptyexpect: output since the previous match:\n%s\n", line, what,
         out ? out + matched : "");
  if (child_status < 0) kill(child, SIGKILL);
  exit(1);
}

static int expect(const char *text, double limit) {
  double end = now() + limit;
  for (;;) {
    char *hit = out ? memmem(out + matched, out_len - matched, text, strlen(text)) : NULL;
    if (hit) { matched = (size_t)(hit - out) + strlen(text); return 1; }
    double left = end - now();
    if (left <= 0) return 0;
    if (!pump(left)) { if (!out || !memmem(out + matched, out_len - matched, text, strlen(text))) return 0; }
  }
}

static int wait_exit(double limit) {
  double end = now() + limit;
  while (now() < end) {
    pump(0.05);
    int st;
    if (waitpid(child, &st, WNOHANG) == child) {
      while (pump(0.05) && now() < end) {}
      child_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return 1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  int first = 1;
  if (first < argc && strcmp(argv[first], "--") == 0) first++;
  if (first >= argc) { fprintf(stderr, "usage: ptyexpect -- COMMAND [ARG...] < SCRIPT\n"); return 2; }
  struct winsize ws = { .ws_row = 50, .ws_col = 200 };
  child = forkpty(&master, NULL, NULL, &ws);
  if (child < 0) { perror("ptyexpect: forkpty"); return 2; }
  if (child == 0) {
    execvp(argv[first], argv + first);
    perror("ptyexpect: exec");
    _exit(127);
  }
  double limit = 10;
  char line[8192];
  int ln = 0;
  while (fgets(line, sizeof line, stdin)) {
    ln++;
    line[strcspn(line, "\n")] = 0;
    char *arg = strchr(line, ' ');
    if (arg) *arg++ = 0; else arg = line + strlen(line);
    char what[8400];
    if (line[0] == '#' || line[0] == 0) continue;
    if (strcmp(line, "send") == 0) {
      size_t n = unescape(arg);
      if (write(master, arg, n) != (ssize_t)n) fail(ln, "cannot write to the terminal");
      pump(0.01);
    } else if (strcmp(line, "expect") == 0) {
      unescape(arg);
      snprintf(what, sizeof what, "expected \"%s\" within %g s", arg, limit);
      if (!expect(arg, limit)) fail(ln, what);
    } else if (strcmp(line, "sleep") == 0) {
      double end = now() + atof(arg);
      while (now() < end && pump(end - now())) {}
    } else if (strcmp(line, "timeout") == 0) {
      limit = atof(arg);
    } else if (strcmp(line, "wait") == 0) {
      if (!wait_exit(limit)) fail(ln, "the command did not end in time");
      if (*arg && atoi(arg) != child_status) {
        snprintf(what, sizeof what, "exit code %d, expected %s", child_status, arg);
        fail(ln, what);
      }
    } else {
      snprintf(what, sizeof what, "unknown step '%s'", line);
      fail(ln, what);
    }
  }
  if (child_status < 0) { kill(child, SIGKILL); waitpid(child, NULL, 0); }
  printf("%s", out ? out : "");
  return 0;
}
