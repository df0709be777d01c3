/* host.c: bin/shard, a small C host that embeds LuaJIT and hands the command line to
 * lua/shard/cli.lua. The runtime is linked in with -Wl,-E, so FFI finds its symbols (and
 * readline's) in this executable. The project root is found from the executable's path. */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cpu/cpu.h"
#include "core/status.h"

/* Ctrl-C for the REPL (lua/shard/repl/interrupt.lua). While a chunk runs the REPL arms the
 * trap: SIGINT then sets a hook, as luajit.c does, that raises "interrupted" at the next Lua
 * instruction the interpreter runs (the REPL runs its chunks with the JIT off, since compiled
 * traces run no hooks). Disarmed (at the prompt, or while a worker of `repl --nproc` waits
 * for its next chunk) SIGINT is only counted; the handler is installed without SA_RESTART so
 * that a poll() waiting for input returns EINTR and the REPL sees the count at once. */
static lua_State *g_L;
static volatile sig_atomic_t g_sigint_armed, g_sigint_count;

static void sigint_stop(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  if (!g_sigint_armed) return;   /* the chunk ended before the hook ran */
  g_sigint_armed = 0;
  luaL_error(L, "interrupted");
}

static void on_sigint(int sig) {
  (void)sig;
  g_sigint_count++;
  if (g_sigint_armed && g_L) lua_sethook(g_L, sigint_stop, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* Installs (on != 0) or removes the trap; returns 0, or -1 with errno. */
int shard_sigint_trap(int on) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on ? on_sigint : SIG_DFL;
  sigemptyset(&sa.sa_mask);
  return sigaction(SIGINT, &sa, NULL);
}

void shard_sigint_arm(int on) { g_sigint_armed = on; }

/* The number of SIGINTs since the last call. */
int shard_sigint_take(void) {
  int n = g_sigint_count;
  g_sigint_count = 0;
  return n;
}

/* Termination signals for shard launch (lua/shard/job.lua): trapped, a signal is only
 * counted, so that the launcher can stop its job before it ends itself; without SA_RESTART,
 * so that the launcher's poll() returns at once. */
static volatile sig_atomic_t g_signal_count[NSIG];

static void on_signal(int sig) { g_signal_count[sig]++; }

/* Traps (on != 0) or restores signal sig; returns 0, or -1 with errno. A signal ignored
 * when the process started (nohup) stays ignored. */
int shard_signal_trap(int sig, int on) {
  if (sig <= 0 || sig >= NSIG) return -1;
  struct sigaction sa;
  if (sigaction(sig, NULL, &sa) != 0) return -1;
  if (sa.sa_handler == SIG_IGN) return 0;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on ? on_signal : SIG_DFL;
  sigemptyset(&sa.sa_mask);
  return sigaction(sig, &sa, NULL);
}

/* The number of signals sig since the last call. */
int shard_signal_take(int sig) {
  if (sig <= 0 || sig >= NSIG) return 0;
  int n = g_signal_count[sig];
  g_signal_count[sig] = 0;
  return n;
}

static int find_root(char *root, size_t size) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return -1;
  exe[n] = 0;
  snprintf(root, size, "%s", dirname(dirname(exe)));   /* <root>/bin/shard -> <root> */
  return 0;
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
  return 1;
}

int main(int argc, char **argv) {
  char root[PATH_MAX];
  const char *home = getenv("SHARD_HOME");
  if (home) snprintf(root, sizeof root, "%s", home);
  else if (find_root(root, sizeof root) == 0) setenv("SHARD_HOME", root, 1);
  else { fprintf(stderr, "shard: cannot locate the project root; set SHARD_HOME\n"); return 2; }
  if (sh_cpu_check() != SH_OK) { fprintf(stderr, "shard: %s\n", sh_last_error()); return 2; }

  lua_State *L = luaL_newstate();
  if (!L) { fprintf(stderr, "shard: cannot create a Lua state\n"); return 2; }
  luaL_openlibs(L);
  g_L = L;

  char path[3 * PATH_MAX];
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  snprintf(path, sizeof path, "%s/lua/?.lua;%s/lua/?/init.lua;%s", root, root, lua_tostring(L, -1));
  lua_pop(L, 1);
  lua_pushstring(L, path);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);

  lua_pushcfunction(L, traceback);
  lua_getglobal(L, "require");
  lua_pushstring(L, "shard.cli");
  if (lua_pcall(L, 1, 1, 1) != 0) {
    fprintf(stderr, "shard: %s\n", lua_tostring(L, -1));
    lua_close(L);
    return 2;
  }
  lua_getfield(L, -1, "main");
  lua_newtable(L);
  for (int i = 1; i < argc; i++) { lua_pushstring(L, argv[i]); lua_rawseti(L, -2, i); }
  int rc = 1;
  if (lua_pcall(L, 1, 1, 1) != 0) fprintf(stderr, "%s\n", lua_tostring(L, -1));
  else rc = lua_isnumber(L, -1) ? (int)lua_tointeger(L, -1) : 0;
  fflush(stdout);
  g_L = NULL;
  lua_close(L);
  return rc;
}
