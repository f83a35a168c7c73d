/* The `sbx` launcher, compiled: what launcher.py does, without starting an interpreter.

   A Python process takes about 9 ms to start here before it runs a line, and every `sbx`
   command handed to `sbx server` paid it. This program speaks the same protocol as
   sandboxer_tui/server/launcher.py (its docstring has it): it finds the server's socket by the same
   folder rule, sends argv, environment, working folder and umask as a marshalled dict, and
   fds 0, 1 and 2 once a child has answered `pid`, forwards SIGINT, SIGTERM and SIGHUP to the
   child and exits with its code. Whenever the Python launcher would run the command itself (no server, a
   declined command, `sbx tui` or `sbx server`, SBX_NO_SERVER set), this one execs Python to
   do so. What it cannot say exactly as the Python launcher would (text that is not UTF-8,
   or a locale that is not; `~user` in SBX_HOME; a folder platformdirs must decide) it
   hands to the Python launcher whole, so whether a command goes to the server never
   depends on which launcher started it. As the Python launcher does, it leaves a folder that
   is not this user's own, or that group or others can write to, to the core (which refuses
   it with one line), sends nothing to a listener of another uid (SO_PEERCRED), and runs
   the command itself when the server does not answer `pid` within ANSWER_WITHIN_S.

   Built by scripts/build-launcher.sh (`make setup`) with -DSBX_PYTHON naming the
   interpreter; tests/test_resident_server.py runs the launcher tests on both launchers. */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <langinfo.h>
#include <limits.h>
#include <locale.h>
#include <pwd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef SBX_PYTHON
#error "build with -DSBX_PYTHON='\"/path/to/python\"' (scripts/build-launcher.sh does)"
#endif

#define PROTOCOL 3
#define ANSWER_WITHIN_S 5 /* launcher.ANSWER_WITHIN_S */
#define SOCKET_NAME "server.sock"
#define APP_NAME "sandboxer"

extern char **environ;

/* ---- handing over to Python ------------------------------------------------------------ */

/* Exec Python with `code` and the command's arguments (sys.argv[1:]). -P: the caller's
   working folder is not put on sys.path. */
static void exec_python(const char *code, int argc, char **argv) {
    char **args = calloc((size_t)argc + 4, sizeof *args);
    if (args) {
        args[0] = SBX_PYTHON;
        args[1] = "-P";
        args[2] = "-c";
        args[3] = (char *)code;
        for (int i = 1; i < argc; i++) args[3 + i] = argv[i];
        execv(SBX_PYTHON, args);
    }
    fprintf(stderr, "sbx: cannot start %s: %s\n", SBX_PYTHON, strerror(errno));
    exit(1);
}

/* No server took the command: run it in a Python process, as launcher.py's main() does. */
static void run_here(int argc, char **argv) {
    exec_python("import sys\nfrom sandboxer_tui.server.launcher import run_here\n"
                "run_here(sys.argv[1:])\n", argc, argv);
}

/* What this program does not say as Python would: the Python launcher does it all. */
static void python_launcher(int argc, char **argv) {
    exec_python("from sandboxer_tui.server.launcher import main\nmain()\n", argc, argv);
}

/* ---- a growable buffer and marshal's encoding ------------------------------------------ */

struct buf {
    char *data;
    size_t len, cap;
    int failed;
};

static void put(struct buf *b, const void *data, size_t n) {
    if (b->failed) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 8192;
        while (cap < b->len + n) cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = 1;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
}

static void put_u32(struct buf *b, uint32_t v) {
    unsigned char le[4] = {v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff, (v >> 24) & 0xff};
    put(b, le, 4);
}

static void put_int(struct buf *b, int32_t v) {
    put(b, "i", 1);
    put_u32(b, (uint32_t)v);
}

/* Python decodes what it reads from the system with UTF-8 and surrogateescape; marshal
   carries str as UTF-8 with surrogatepass. The two agree on strict UTF-8 (no surrogates, no
   overlong forms) and only there; anything else goes to the Python launcher. */
static int strict_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t more;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            more = 1, cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            more = 2, cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            more = 3, cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i <= more) return 0;
        for (size_t k = 1; k <= more; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((more == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (more == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        i += more + 1;
    }
    return 1;
}

/* A str; marks the buffer failed (so the caller hands over to Python) if not strict UTF-8. */
static void put_str(struct buf *b, const char *s, size_t n) {
    if (!strict_utf8((const unsigned char *)s, n) || n > INT32_MAX) {
        b->failed = 1;
        return;
    }
    put(b, "u", 1);
    put_u32(b, (uint32_t)n);
    put(b, s, n);
}

static void put_cstr(struct buf *b, const char *s) { put_str(b, s, strlen(s)); }

/* ---- the folder: launcher.home(), which follows core.settings.sbx_home() ---------------- */

static char *concat(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *out = malloc(la + lb + 1);
    if (!out) return NULL;
    memcpy(out, a, la);
    memcpy(out + la, b, lb + 1);
    return out;
}

/* os.path.expanduser for `~` and `~/...`; NULL for `~user` (left to Python). */
static char *expanduser(const char *path) {
    if (path[0] != '~') return strdup(path);
    const char *rest = path + 1;
    if (*rest && *rest != '/') return NULL;
    const char *home = getenv("HOME");
    if (!home) {
        struct passwd *pw = getpwuid(getuid());
        if (!pw) return strdup(path);
        home = pw->pw_dir;
    }
    size_t n = strlen(home);
    while (n && home[n - 1] == '/') n--;
    char *out = malloc(n + strlen(rest) + 2);
    if (!out) return NULL;
    memcpy(out, home, n);
    strcpy(out + n, rest);
    if (!*out) strcpy(out, "/");
    return out;
}

/* os.path.join(base, APP_NAME) */
static char *join_app(const char *base) {
    size_t n = strlen(base);
    return concat(base, n && base[n - 1] == '/' ? APP_NAME : "/" APP_NAME);
}

/* launcher.home(): the state folder where every platformdirs release agrees; NULL for the
   rest, which the Python launcher asks platformdirs about. */
static char *home(void) {
    const char *raw = getenv("SBX_HOME");
    if (raw && *raw) return expanduser(raw);
    if (getenv("ANDROID_DATA")) return NULL;
    const char *data = getenv("XDG_DATA_HOME");
    const char *user = getenv("HOME");
    if (data && data[0] == '/') return join_app(data);
    if ((data && *data) || !user || user[0] != '/') return NULL;
    char *share = expanduser("~/.local/share");  /* HOME, absolute: what every release uses */
    char *out = share ? join_app(share) : NULL;
    free(share);
    return out;
}

/* What Python's start-up does with the locale before it reads the environment (PEP 538 and
   540): with LC_CTYPE resolving to C and LC_ALL unset, it sets LC_CTYPE to the first of
   these the system has, in its own environment, which the server's child then inherits. */
static const char *const COERCION_TARGETS[] = {"C.UTF-8", "C.utf8", "UTF-8"};

/* Whether Python would decode this process's arguments and environment as UTF-8, and what
   it would set LC_CTYPE to (`coerced`, else NULL). 0 when unsure: the Python launcher then
   does it all. */
static int python_reads_utf8(const char **coerced) {
    *coerced = NULL;
    const char *utf8_mode = getenv("PYTHONUTF8");
    const char *coercion = getenv("PYTHONCOERCECLOCALE");
    if (utf8_mode && *utf8_mode && strcmp(utf8_mode, "0") != 0 && strcmp(utf8_mode, "1") != 0)
        return 0;  /* Python refuses to start: let it say so */
    if (coercion && strcmp(coercion, "warn") == 0) return 0;  /* it warns: let it */
    setlocale(LC_CTYPE, "");
    const char *ctype = setlocale(LC_CTYPE, NULL);
    const char *all = getenv("LC_ALL");
    if (ctype && strcmp(ctype, "C") == 0) {
        if ((all && *all) || (coercion && strcmp(coercion, "0") == 0))
            return !(utf8_mode && strcmp(utf8_mode, "0") == 0);  /* C: UTF-8 mode */
        for (size_t i = 0; i < sizeof COERCION_TARGETS / sizeof *COERCION_TARGETS; i++) {
            if (setlocale(LC_CTYPE, COERCION_TARGETS[i])) {
                const char *codeset = nl_langinfo(CODESET);
                if (codeset && *codeset) {
                    *coerced = COERCION_TARGETS[i];
                    break;
                }
                setlocale(LC_CTYPE, "");
            }
        }
        return !(utf8_mode && strcmp(utf8_mode, "0") == 0) || *coerced;
    }
    if (utf8_mode && strcmp(utf8_mode, "1") == 0) return 1;
    const char *codeset = nl_langinfo(CODESET);
    return codeset && strcmp(codeset, "UTF-8") == 0;
}

/* ---- the request --------------------------------------------------------------------- */

/* os.environ: entries with '=', the first of a repeated name wins; LC_CTYPE as Python's
   locale coercion leaves it (`coerced`), when it did coerce. */
static void put_env(struct buf *b, const char *coerced) {
    size_t count = 0;
    for (char **e = environ; *e; e++) count++;
    put(b, "{", 1);
    for (size_t i = 0; i < count; i++) {
        const char *eq = strchr(environ[i], '=');
        if (!eq) continue;
        size_t klen = (size_t)(eq - environ[i]);
        int repeated = 0;
        for (size_t j = 0; j < i && !repeated; j++)
            repeated = strncmp(environ[j], environ[i], klen + 1) == 0;
        if (repeated || (coerced && klen == 8 && strncmp(environ[i], "LC_CTYPE", 8) == 0))
            continue;
        put_str(b, environ[i], klen);
        put_cstr(b, eq + 1);
    }
    if (coerced) {
        put_cstr(b, "LC_CTYPE");
        put_cstr(b, coerced);
    }
    put(b, "0", 1);
}

/* The framed request (4-byte big-endian length, then the marshalled dict); 0 if it cannot
   be said the way the Python launcher would say it. */
static int build_request(struct buf *b, int argc, char **argv, const char *coerced) {
    char *cwd = getcwd(NULL, 0);
    if (!cwd) return 0;
    mode_t mask = umask(077);
    umask(mask);
    put(b, "\0\0\0\0{", 5);
    put_cstr(b, "protocol");
    put_int(b, PROTOCOL);
    put_cstr(b, "executable");
    put_cstr(b, SBX_PYTHON);
    put_cstr(b, "argv");
    put(b, "[", 1);
    put_u32(b, (uint32_t)(argc - 1));
    for (int i = 1; i < argc; i++) put_cstr(b, argv[i]);
    put_cstr(b, "env");
    put_env(b, coerced);
    put_cstr(b, "cwd");
    put_cstr(b, cwd);
    put_cstr(b, "umask");
    put_int(b, (int32_t)mask);
    put(b, "0", 1);
    free(cwd);
    if (b->failed || b->len - 4 > UINT32_MAX) return 0;
    uint32_t body = (uint32_t)(b->len - 4);
    unsigned char be[4] = {body >> 24, (body >> 16) & 0xff, (body >> 8) & 0xff, body & 0xff};
    memcpy(b->data, be, 4);
    return 1;
}

/* ---- talking to the server ----------------------------------------------------------- */

/* launcher.private_folder: a folder of this user that group and others cannot write to. */
static int private_folder(const char *folder) {
    struct stat st;
    return stat(folder, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() &&
           !(st.st_mode & (S_IWGRP | S_IWOTH));
}

/* How long a read or a write on the socket waits (0: for ever). */
static int socket_timeout(int sock, int seconds) {
    struct timeval limit = {.tv_sec = seconds};
    return setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit) == 0 &&
           setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit) == 0;
}

/* A connected socket to a listener of this user; -1 for none (no server, a stale socket,
   another user's listener: it gets nothing). */
static int connect_server(const char *folder) {
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    size_t n = strlen(folder) + 1 + strlen(SOCKET_NAME);
    if (n < 100) {
        snprintf(path, sizeof path, "%s/%s", folder, SOCKET_NAME);
    } else {  /* too long for AF_UNIX: through /proc/self/fd, as launcher.socket_address does */
        int dir = open(folder, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0) return -1;
        snprintf(path, sizeof path, "/proc/self/fd/%d/%s", dir, SOCKET_NAME);
    }
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) return -1;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy(addr.sun_path, path);
    struct ucred peer;
    socklen_t size = sizeof peer;
    if (!socket_timeout(sock, ANSWER_WITHIN_S) ||
        connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0 ||
        getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &size) < 0 || size != sizeof peer ||
        peer.uid != geteuid()) {
        close(sock);
        return -1;
    }
    return sock;
}

static int timed_out(void) { return errno == EAGAIN || errno == EWOULDBLOCK; }

/* The server took the socket but not the command in time: say so, then run it here. */
static void not_answered(int argc, char **argv) {
    fprintf(stderr, "sbx: the sbx server did not answer within %d s; running the command here\n",
            ANSWER_WITHIN_S);
    run_here(argc, argv);
}

static int send_request(int sock, const struct buf *b) {
    for (size_t done = 0; done < b->len;) {
        ssize_t more = send(sock, b->data + done, b->len - done, MSG_NOSIGNAL);
        if (more < 0 && errno == EINTR) continue;
        if (more <= 0) return 0;
        done += (size_t)more;
    }
    return 1;
}

/* launcher.send_fds: fds 0, 1 and 2 on one byte, once a child has answered `pid`. */
static void send_fds(int sock) {
    int fds[3] = {0, 1, 2};
    union {  /* aligned for struct cmsghdr */
        char data[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct iovec iov = {.iov_base = "", .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.data,
                         .msg_controllen = sizeof control.data};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
    ssize_t sent;
    do sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    /* failed: it has gone, and the missing `exit` says so */
}

struct lines {
    int sock;
    char data[4096];
    size_t len;
};

/* The next reply line (without its newline) into `line`; 0 at the end of the stream, or when
   the socket's timeout passed (errno says which). */
static int next_line(struct lines *r, char *line, size_t size) {
    for (;;) {
        char *nl = memchr(r->data, '\n', r->len);
        if (nl) {
            size_t n = (size_t)(nl - r->data);
            if (n >= size) n = size - 1;
            memcpy(line, r->data, n);
            line[n] = 0;
            r->len -= (size_t)(nl - r->data) + 1;
            memmove(r->data, nl + 1, r->len);
            return 1;
        }
        if (r->len == sizeof r->data) {
            errno = 0;
            return 0;
        }
        ssize_t got = read(r->sock, r->data + r->len, sizeof r->data - r->len);
        if (got < 0 && errno == EINTR) continue;
        if (got == 0) errno = 0;
        if (got <= 0) return 0;
        r->len += (size_t)got;
    }
}

static volatile pid_t child;

static void forward(int signum) {
    int saved = errno;
    kill(child, signum);
    errno = saved;
}

/* launcher.wants_server */
static int wants_server(int argc, char **argv) {
    const char *off = getenv("SBX_NO_SERVER");
    if ((off && *off) || argc < 2) return 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') continue;
        return strcmp(argv[i], "tui") != 0 && strcmp(argv[i], "server") != 0;
    }
    return 1;
}

/* launcher.reply_number: an optional '-' and ASCII digits, nothing else, in range; 0 if it
   is not one. */
static int reply_number(const char *text, long low, long high, long *value) {
    const char *digits = text[0] == '-' ? text + 1 : text;
    if (!*digits) return 0;
    for (const char *c = digits; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    char *end;
    errno = 0;
    *value = strtol(text, &end, 10);
    return !errno && end != text && !*end && *value >= low && *value <= high;
}

/* What follows `word` on a reply line ("" when nothing does), as launcher._Lines splits it;
   NULL when the line is another word. */
static const char *reply_rest(const char *line, const char *word) {
    size_t n = strlen(word);
    if (strncmp(line, word, n) != 0 || (line[n] != ' ' && line[n] != 0)) return NULL;
    return line[n] ? line + n + 1 : line + n;
}

/* Forward `signum` to the child, unless it is ignored here (nohup, a background job). */
static void forward_signal(int signum) {
    struct sigaction current;
    if (sigaction(signum, NULL, &current) == 0 && current.sa_handler == SIG_IGN) return;
    struct sigaction forwarding = {.sa_handler = forward};  /* no SA_RESTART: reads see EINTR */
    sigemptyset(&forwarding.sa_mask);
    sigaction(signum, &forwarding, NULL);
}

int main(int argc, char **argv) {
    if (!wants_server(argc, argv)) run_here(argc, argv);
    const char *coerced;
    char *folder = python_reads_utf8(&coerced) ? home() : NULL;
    struct buf request = {0};
    if (!folder || !build_request(&request, argc, argv, coerced)) python_launcher(argc, argv);
    /* none yet (so no server), or one the core refuses, saying why */
    if (!private_folder(folder)) run_here(argc, argv);
    int sock = connect_server(folder);
    if (sock < 0) run_here(argc, argv);
    if (!send_request(sock, &request)) {  /* exec closes the socket */
        if (timed_out()) not_answered(argc, argv);
        run_here(argc, argv);
    }
    struct lines replies = {.sock = sock};
    char line[256];
    long number;
    if (!next_line(&replies, line, sizeof line)) {
        if (timed_out()) not_answered(argc, argv);
        run_here(argc, argv);  /* it went away */
    }
    const char *rest = reply_rest(line, "pid");
    if (!rest) run_here(argc, argv);  /* declined (another Python, its code changed): run here */
    /* never 0 or -1: a signal forwarded there reaches a process group */
    if (!reply_number(rest, 1, INT_MAX, &number)) {
        fputs("sbx: the sbx server answered with no process id\n", stderr);
        return 1;
    }
    socket_timeout(sock, 0);  /* the command takes as long as it takes */
    send_fds(sock);
    child = (pid_t)number;
    forward_signal(SIGINT);
    forward_signal(SIGTERM);
    forward_signal(SIGHUP);
    if (!next_line(&replies, line, sizeof line) || !(rest = reply_rest(line, "exit"))) {
        fputs("sbx: the sbx server went away while running the command\n", stderr);
        return 1;
    }
    if (!reply_number(rest, INT_MIN, INT_MAX, &number)) {
        fputs("sbx: the sbx server answered with no exit code\n", stderr);
        return 1;
    }
    _exit((int)number);
}
