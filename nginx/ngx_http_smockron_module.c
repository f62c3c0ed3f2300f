/*
 * smockron's nginx gatekeeper: the Smockron protocol (docs/protocol.md) inside nginx.
 *
 * Every worker decides its requests from a shared memory zone (the master's
 * DELAY_UNTILs and the first line's arrival times, an rbtree in a slab pool as
 * limit_req keeps its zone), delays them on a timer or rejects them with Retry-After,
 * and publishes its accounting on a ZeroMQ socket of its own. Worker 0 alone reads the
 * control socket (and its monitor), writes what the master says into the zone, and
 * asks for RESYNCs: the others see the verdicts through the zone.
 *
 * The decision mirrors smockron/gatekeeper/_decider.py and _firstline.py; the bytes
 * on the wire are smockron/wire/codec.py's.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <math.h>
#include <sodium.h>
#include <zmq.h>


#define SMK_MAX_DOMAINS     64
#define SMK_MAX_RULES       64      /* a rules offer holds at most 64 */
#define SMK_MAX_FRAMES      (4 + SMK_MAX_RULES)
#define SMK_MAX_DOMAIN      256
#define SMK_MAX_IDENTIFIER  1024    /* longer ones are decided by their digest */
#define SMK_MAX_LOGINFO     512
#define SMK_MAX_TS          253402300799999LL   /* 9999-12-31T23:59:59.999Z */
#define SMK_NEVER           (-1e300)
#define SMK_RULES_TOPIC     "\0smockron\0"
#define SMK_RULES_TOPIC_LEN 10
#define SMK_TICK_MS         50
#define SMK_RESYNC_TRIES    8
#define SMK_PRIVATE_TRIES   4       /* unanswered private RESYNCs before bare ones */
#define SMK_REPLY_PREFIX    "\0smockron-resync\0"
#define SMK_REPLY_PREFIX_LEN 17
#define SMK_MAX_RECHECKS    100
#define SMK_LOG_EVERY_MS    10000


enum {
    SMK_ACCEPTED, SMK_DELAYED, SMK_REJECTED, SMK_DELAYED_AGAIN,
    SMK_REJECTED_AFTER_DELAY, SMK_CONTROL_RECEIVED, SMK_CONTROL_MALFORMED,
    SMK_CONTROL_IGNORED, SMK_CONTROL_REFUSED, SMK_CONTROL_LOST, SMK_RULES_RECEIVED,
    SMK_IDENTIFIERS_HASHED, SMK_ACCOUNTING_SENT, SMK_ACCOUNTING_DROPPED,
    SMK_ACCOUNTING_SAMPLED_OUT, SMK_DELAY_TABLE_EVICTED, SMK_HANDSHAKES_FAILED,
    SMK_RESYNCS_SENT, SMK_NCOUNTERS
};

static const char *smk_counter_names[SMK_NCOUNTERS] = {
    "decisions_total{verdict=\"accepted\"}", "decisions_total{verdict=\"delayed\"}",
    "decisions_total{verdict=\"rejected\"}", "delayed_again_total",
    "rejected_after_delay_total", "control_received_total", "control_malformed_total",
    "control_ignored_total", "control_refused_total", "control_lost_total",
    "rules_received_total", "identifiers_hashed_total", "accounting_sent_total",
    "accounting_dropped_total", "accounting_sampled_out_total",
    "delay_table_evicted_total", "handshakes_failed_total", "resyncs_sent_total"
};


/* A domain's first line: GCRA per rule (see _firstline.py's Line). */
typedef struct {
    ngx_uint_t                  nrules;     /* 0: no first line */
    ngx_uint_t                  fastest;    /* the spacing a DELAY_UNTIL implies */
    ngx_uint_t                  gen;        /* changes with the line: times restart */
    double                      interval[SMK_MAX_RULES];
    double                      tolerance[SMK_MAX_RULES];
} smk_line_t;


typedef struct {
    ngx_rbtree_t                rbtree;
    ngx_rbtree_node_t           sentinel;
    ngx_queue_t                 queue;      /* least recently used last */
    ngx_atomic_t                entries;
    ngx_atomic_t                waiting;    /* requests sleeping out a delay */
    ngx_atomic_t                master_connected;
    ngx_atomic_t                control_connected;
    ngx_atomic_t                auth_problem;
    ngx_atomic_t                counters[SMK_NCOUNTERS];
    ngx_uint_t                  ndomains;
    u_char                      names[SMK_MAX_DOMAINS][SMK_MAX_DOMAIN + 1];
    smk_line_t                  lines[SMK_MAX_DOMAINS];
} smk_shctx_t;


/* One identifier of one domain: the master's time, and the first line's. */
typedef struct {
    ngx_rbtree_node_t           rb;         /* key: hash of domain and identifier */
    ngx_queue_t                 queue;
    uint16_t                    domain;
    uint16_t                    len;
    uint8_t                     cap;        /* arrival times allocated */
    ngx_uint_t                  gen;        /* of the line the times belong to */
    int64_t                     until;      /* the master's DELAY_UNTIL */
    double                      next_free;  /* next slot a woken request may take */
    double                      tat[1];     /* cap of them, then the identifier */
} smk_node_t;

#define smk_node_ident(n)  ((u_char *) &(n)->tat[(n)->cap ? (n)->cap : 1])


typedef struct {
    ngx_str_t                   domain;
    ngx_str_t                   algorithm;
    double                      rate;
    ngx_uint_t                  burst;
} smk_rule_t;


typedef struct {
    ngx_str_t                   accounting;
    ngx_str_t                   control;
    size_t                      shm_size;
    ngx_flag_t                  master_rules;
    ngx_uint_t                  max_delayed;
    ngx_msec_t                  max_ahead;
    ngx_str_t                   reject_sample_text;
    double                      reject_sample;
    u_char                      curve_public[41];
    u_char                      curve_secret[41];
    u_char                      curve_server[41];
    ngx_array_t                 domains;    /* ngx_str_t, NUL-terminated */
    ngx_array_t                 rules;      /* smk_rule_t */
    ngx_array_t                *algorithms; /* ngx_str_t "DOMAIN=ALG" */
    smk_line_t                 *configured; /* per domain */
    ngx_shm_zone_t             *zone;
} smk_main_conf_t;


typedef struct {
    ngx_flag_t                  enabled;
    ngx_str_t                   domain;
    ngx_uint_t                  domain_idx;
    ngx_http_complex_value_t   *identifier;
    ngx_http_complex_value_t   *log_info;
    ngx_msec_t                  max_delay;
    ngx_uint_t                  status_code;
    ngx_flag_t                  stats;
} smk_loc_conf_t;


/* A delayed request, between its sleeps (see _decider.py's Waiting). */
typedef struct {
    smk_loc_conf_t             *conf;
    ngx_str_t                   ident;
    ngx_str_t                   loginfo;
    int64_t                     received;
    int64_t                     until;
    ngx_uint_t                  tries;
    unsigned                    paced:1;
    unsigned                    held:1;
    unsigned                    waiting:1;  /* holds a max_delayed slot */
    unsigned                    done:1;
    unsigned                    verdict:2;  /* for $smockron_decision */
} smk_ctx_t;


/* What worker 0 knows of each domain's control stream. */
typedef struct {
    ngx_uint_t                  resync_left;    /* RESYNCs still to send */
    u_char                      reply[40];      /* our private answers' topic */
    size_t                      reply_len;
    ngx_msec_t                  resync_at;
    ngx_uint_t                  heard;          /* a PUBLISHED counter seen */
    uint64_t                    published;
    uint64_t                    received;       /* DELAY_UNTILs since that counter */
} smk_stream_t;


static ngx_int_t smk_preinit(ngx_conf_t *cf);
static ngx_int_t smk_init(ngx_conf_t *cf);
static void *smk_create_main_conf(ngx_conf_t *cf);
static char *smk_init_main_conf(ngx_conf_t *cf, void *conf);
static void *smk_create_loc_conf(ngx_conf_t *cf);
static char *smk_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child);
static char *smk_set_master(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static char *smk_set_rule(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static char *smk_set_curve_key(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static char *smk_set_stats(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static ngx_int_t smk_init_process(ngx_cycle_t *cycle);
static void smk_exit_process(ngx_cycle_t *cycle);
static ngx_int_t smk_handler(ngx_http_request_t *r);


/* a directive of any block, set in the location's conf; or of http{} (or any block,
 * `where`), set in the main conf */
#define SMK_ANY_BLOCK  (NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF)
#define SMK_LOC(name, args, set, field)                                             \
    { ngx_string(name), SMK_ANY_BLOCK|args, set, NGX_HTTP_LOC_CONF_OFFSET,          \
      offsetof(smk_loc_conf_t, field), NULL }
#define SMK_MAIN(name, where, set, offset)                                          \
    { ngx_string(name), where, set, NGX_HTTP_MAIN_CONF_OFFSET, offset, NULL }
#define SMK_MAIN_FIELD(name, where, set, field)                                     \
    SMK_MAIN(name, where, set, offsetof(smk_main_conf_t, field))
#define SMK_HTTP1      (NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1)

static ngx_command_t smk_commands[] = {
    /* the original module's directives, same names and meaning (smockron_server: the
     * name of smockron_master in its first versions) */
    SMK_LOC("smockron", NGX_CONF_FLAG, ngx_conf_set_flag_slot, enabled),
    SMK_MAIN_FIELD("smockron_master", SMK_ANY_BLOCK|NGX_CONF_TAKE1, smk_set_master,
                   accounting),
    SMK_MAIN_FIELD("smockron_server", SMK_ANY_BLOCK|NGX_CONF_TAKE1, smk_set_master,
                   accounting),
    SMK_LOC("smockron_domain", NGX_CONF_TAKE1, ngx_conf_set_str_slot, domain),
    SMK_LOC("smockron_identifier", NGX_CONF_TAKE1, ngx_http_set_complex_value_slot,
            identifier),
    SMK_LOC("smockron_log_info", NGX_CONF_TAKE1, ngx_http_set_complex_value_slot, log_info),
    SMK_LOC("smockron_max_delay", NGX_CONF_TAKE1, ngx_conf_set_msec_slot, max_delay),
    SMK_LOC("smockron_status_code", NGX_CONF_TAKE1, ngx_conf_set_num_slot, status_code),
    SMK_MAIN_FIELD("smockron_shm_size", SMK_HTTP1, ngx_conf_set_size_slot, shm_size),

    /* smockron's own (smockron_curve_*: 1 for this gatekeeper's keys, 0 the master's) */
    SMK_MAIN_FIELD("smockron_control", SMK_HTTP1, smk_set_master, control),
    SMK_MAIN("smockron_rule", SMK_HTTP1, smk_set_rule, 0),
    SMK_MAIN_FIELD("smockron_algorithm", SMK_HTTP1, ngx_conf_set_str_array_slot, algorithms),
    SMK_MAIN_FIELD("smockron_master_rules", NGX_HTTP_MAIN_CONF|NGX_CONF_FLAG,
                   ngx_conf_set_flag_slot, master_rules),
    SMK_MAIN_FIELD("smockron_max_delayed", SMK_HTTP1, ngx_conf_set_num_slot, max_delayed),
    SMK_MAIN_FIELD("smockron_max_ahead", SMK_HTTP1, ngx_conf_set_msec_slot, max_ahead),
    SMK_MAIN_FIELD("smockron_reject_sample", SMK_HTTP1, ngx_conf_set_str_slot,
                   reject_sample_text),
    SMK_MAIN("smockron_curve_secret", SMK_HTTP1, smk_set_curve_key, 1),
    SMK_MAIN("smockron_curve_server", SMK_HTTP1, smk_set_curve_key, 0),
    { ngx_string("smockron_stats"), NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS, smk_set_stats,
      NGX_HTTP_LOC_CONF_OFFSET, 0, NULL },

    ngx_null_command
};


static ngx_http_module_t smk_module_ctx = {
    smk_preinit,                /* preconfiguration */
    smk_init,                   /* postconfiguration */
    smk_create_main_conf,
    smk_init_main_conf,
    NULL, NULL,
    smk_create_loc_conf,
    smk_merge_loc_conf
};


ngx_module_t ngx_http_smockron_module = {
    NGX_MODULE_V1,
    &smk_module_ctx,
    smk_commands,
    NGX_HTTP_MODULE,
    NULL, NULL,
    smk_init_process,
    NULL, NULL,
    smk_exit_process,
    NULL,
    NGX_MODULE_V1_PADDING
};


/* per worker */
static smk_main_conf_t     *smk_mcf;
static smk_shctx_t         *smk_sh;
static ngx_slab_pool_t     *smk_shpool;
static void                *smk_zctx;
static void                *smk_acc;        /* XPUB towards the master */
static void                *smk_sub;        /* worker 0: control */
static void                *smk_mon;        /* worker 0: the control socket's monitor */
static void                *smk_acc_mon;    /* the accounting socket's */
static ngx_connection_t    *smk_acc_conn, *smk_sub_conn, *smk_mon_conn, *smk_acc_mon_conn;
static ngx_event_t          smk_tick;
static ngx_connection_t     smk_tick_conn;  /* what nginx's timer log lines read */
static ngx_uint_t           smk_subscribed; /* the master's subscription is here */
static double               smk_reject_credit;
static smk_stream_t         smk_streams[SMK_MAX_DOMAINS];
static ngx_msec_t           smk_malformed_logged;
static ngx_uint_t           smk_malformed_quiet;


#define smk_count(i)  ngx_atomic_fetch_add(&smk_sh->counters[i], 1)
#define smk_warn(fmt, ...)                                                          \
    ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0, "smockron: " fmt, __VA_ARGS__)

/* byte strings alike, exactly or ignoring case; and a byte string equal to a literal */
#define smk_eq(a, alen, b, blen)  ((alen) == (blen) && ngx_memcmp(a, b, blen) == 0)
#define smk_caseeq(a, alen, b, blen)                                                \
    ((alen) == (blen) && ngx_strncasecmp((u_char *) (a), (u_char *) (b), blen) == 0)
#define smk_str_eq(a, b)          smk_eq((a)->data, (a)->len, (b)->data, (b)->len)
#define smk_is(p, len, lit)       smk_eq(p, len, lit, sizeof(lit) - 1)
#define smk_caseis(p, len, lit)   smk_caseeq(p, len, lit, sizeof(lit) - 1)


static int64_t
smk_now_ms(void)
{
    ngx_time_t  *tp = ngx_timeofday();

    return (int64_t) tp->sec * 1000 + tp->msec;
}


/* ---- configuration ---------------------------------------------------------------- */

static void *
smk_create_main_conf(ngx_conf_t *cf)
{
    smk_main_conf_t  *mcf;

    mcf = ngx_pcalloc(cf->pool, sizeof(smk_main_conf_t));
    if (mcf == NULL) {
        return NULL;
    }
    mcf->shm_size = NGX_CONF_UNSET_SIZE;
    mcf->master_rules = NGX_CONF_UNSET;
    mcf->max_delayed = NGX_CONF_UNSET_UINT;
    mcf->max_ahead = NGX_CONF_UNSET_MSEC;
    mcf->algorithms = NGX_CONF_UNSET_PTR;
    if (ngx_array_init(&mcf->domains, cf->pool, 4, sizeof(ngx_str_t)) != NGX_OK
        || ngx_array_init(&mcf->rules, cf->pool, 4, sizeof(smk_rule_t)) != NGX_OK)
    {
        return NULL;
    }
    return mcf;
}


/* "tcp://host:10004" -> "tcp://host:10005": the original module's convention. */
static ngx_int_t
smk_next_port(ngx_pool_t *pool, ngx_str_t *acc, ngx_str_t *ctl)
{
    u_char     *colon, *p;
    ngx_int_t   port;

    colon = NULL;
    for (p = acc->data; p < acc->data + acc->len; p++) {
        if (*p == ':') {
            colon = p;
        }
    }
    if (colon == NULL) {
        return NGX_ERROR;
    }
    port = ngx_atoi(colon + 1, acc->data + acc->len - colon - 1);
    if (port == NGX_ERROR || port >= 65535) {
        return NGX_ERROR;
    }
    ctl->data = ngx_pnalloc(pool, acc->len + 8);
    if (ctl->data == NULL) {
        return NGX_ERROR;
    }
    p = ngx_sprintf(ctl->data, "%*s%i", (size_t) (colon + 1 - acc->data), acc->data,
                    port + 1);
    *p = '\0';
    ctl->len = p - ctl->data;
    return NGX_OK;
}


static char *
smk_init_main_conf(ngx_conf_t *cf, void *conf)
{
    smk_main_conf_t  *mcf = conf;
    u_char           *end;

    ngx_conf_init_size_value(mcf->shm_size, 32 * 1024 * 1024);
    ngx_conf_init_value(mcf->master_rules, 1);
    ngx_conf_init_uint_value(mcf->max_delayed, 1000);
    ngx_conf_init_msec_value(mcf->max_ahead, 86400000);
    if (mcf->accounting.data == NULL) {
        ngx_str_set(&mcf->accounting, "tcp://localhost:10004");
    }
    if (mcf->control.data == NULL
        && smk_next_port(cf->pool, &mcf->accounting, &mcf->control) != NGX_OK)
    {
        return "cannot derive the control address from smockron_master: "
               "give smockron_control";
    }
    mcf->reject_sample = 1.0;
    if (mcf->reject_sample_text.data != NULL) {
        mcf->reject_sample = strtod((char *) mcf->reject_sample_text.data, (char **) &end);
        if (end != mcf->reject_sample_text.data + mcf->reject_sample_text.len
            || !(mcf->reject_sample >= 0.0 && mcf->reject_sample <= 1.0))
        {
            return "smockron_reject_sample must be a number from 0 to 1";
        }
    }
    if (mcf->curve_secret[0] != '\0' && mcf->curve_server[0] == '\0') {
        return "smockron_curve_secret needs smockron_curve_server (the master's public key)";
    }
    if (mcf->curve_server[0] != '\0' && mcf->curve_secret[0] == '\0') {
        return "smockron_curve_server needs smockron_curve_secret (this gatekeeper's keys)";
    }
    return NGX_CONF_OK;
}


/* smockron_master and smockron_control: one master per nginx, whatever the block. */
static char *
smk_set_master(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_str_t  *field = (ngx_str_t *) ((char *) conf + cmd->offset);
    ngx_str_t  *value = cf->args->elts;

    if (field->data != NULL) {
        if (smk_str_eq(field, &value[1])) {
            return NGX_CONF_OK;
        }
        return "names a second master: one nginx follows one master";
    }
    *field = value[1];
    return NGX_CONF_OK;
}


static ngx_int_t
smk_unit_seconds(u_char *p, size_t len, double *seconds)
{
    static const struct { const char *name; double s; } units[] = {
        { "ms", 0.001 }, { "msec", 0.001 }, { "s", 1 }, { "sec", 1 }, { "secs", 1 },
        { "second", 1 }, { "seconds", 1 }, { "m", 60 }, { "min", 60 }, { "mins", 60 },
        { "minute", 60 }, { "minutes", 60 }, { "h", 3600 }, { "hr", 3600 },
        { "hour", 3600 }, { "hours", 3600 }, { "d", 86400 }, { "day", 86400 },
        { "days", 86400 }
    };
    ngx_uint_t  i;

    for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (smk_caseeq(p, len, units[i].name, ngx_strlen(units[i].name))) {
            *seconds = units[i].s;
            return NGX_OK;
        }
    }
    return NGX_ERROR;
}


/* smockron_rule DOMAIN:RATE/UNIT:BURST, as `smockron proxy --rule`. */
static char *
smk_set_rule(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    smk_main_conf_t  *mcf = conf;
    ngx_str_t        *value = cf->args->elts;
    u_char           *s, *c1, *c2, *slash, *p, *end;
    double            count, periods, seconds;
    ngx_int_t         burst;
    smk_rule_t       *rule;

    s = value[1].data;
    end = s + value[1].len;
    c2 = NULL;
    c1 = NULL;
    for (p = end - 1; p >= s; p--) {
        if (*p == ':') {
            if (c2 == NULL) {
                c2 = p;
            } else {
                c1 = p;
                break;
            }
        }
    }
    if (c1 == NULL || c1 == s) {
        return "expects DOMAIN:RATE/UNIT:BURST, such as api:10/s:20";
    }
    slash = ngx_strlchr(c1 + 1, c2, '/');
    if (slash == NULL) {
        return "has no RATE/UNIT, such as 10/s";
    }
    count = strtod((char *) c1 + 1, (char **) &p);
    if (p != slash || !(count > 0) || !isfinite(count)) {
        return "has a bad rate: expected RATE/UNIT such as 10/s";
    }
    periods = 1;
    p = slash + 1;
    if (p < c2 && *p >= '0' && *p <= '9') {  /* "1/2s": one per two seconds */
        periods = strtod((char *) p, (char **) &p);
    }
    if (smk_unit_seconds(p, c2 - p, &seconds) != NGX_OK || !(periods > 0)) {
        return "has an unknown time unit: use s, m, h or d";
    }
    burst = ngx_atoi(c2 + 1, end - c2 - 1);
    if (burst == NGX_ERROR || burst < 1) {
        return "has a bad burst: an integer >= 1";
    }
    rule = ngx_array_push(&mcf->rules);
    if (rule == NULL) {
        return NGX_CONF_ERROR;
    }
    rule->domain.data = s;
    rule->domain.len = c1 - s;
    rule->rate = count / (seconds * periods);
    rule->burst = burst;
    return NGX_CONF_OK;
}


/* A key file in zmq.auth's certificate format (`smockron keygen`). */
static char *
smk_set_curve_key(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    smk_main_conf_t  *mcf = conf;
    ngx_str_t        *value = cf->args->elts;
    u_char            text[4096], *p, *q, *dst;
    ssize_t           n;
    ngx_fd_t          fd;
    ngx_uint_t        i;
    const char       *names[2] = { "public-key", "secret-key" };

    if (!zmq_has("curve")) {
        return "needs CURVE, which this libzmq lacks";
    }
    fd = ngx_open_file(value[1].data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno, "cannot open \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }
    n = read(fd, text, sizeof(text) - 1);
    ngx_close_file(fd);
    if (n <= 0) {
        return "cannot read the key file";
    }
    text[n] = '\0';
    for (i = 0; i < 2; i++) {
        if (cmd->offset == 0 && i == 1) {
            break;  /* the master's key: its public half only */
        }
        dst = cmd->offset ? (i ? mcf->curve_secret : mcf->curve_public)
                          : mcf->curve_server;
        p = (u_char *) ngx_strstr(text, names[i]);
        p = p ? (u_char *) ngx_strchr(p, '"') : NULL;
        q = p ? (u_char *) ngx_strchr(p + 1, '"') : NULL;
        if (q == NULL || q - p - 1 != 40) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "\"%V\" holds no %s", &value[1],
                               names[i]);
            return NGX_CONF_ERROR;
        }
        ngx_memcpy(dst, p + 1, 40);
        dst[40] = '\0';
    }
    return NGX_CONF_OK;
}


static void *
smk_create_loc_conf(ngx_conf_t *cf)
{
    smk_loc_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(smk_loc_conf_t));
    if (conf == NULL) {
        return NULL;
    }
    conf->enabled = NGX_CONF_UNSET;
    conf->max_delay = NGX_CONF_UNSET_MSEC;
    conf->status_code = NGX_CONF_UNSET_UINT;
    conf->identifier = NGX_CONF_UNSET_PTR;
    conf->log_info = NGX_CONF_UNSET_PTR;
    return conf;
}


static ngx_int_t
smk_domain_find(smk_main_conf_t *mcf, ngx_str_t *name)
{
    ngx_str_t   *d = mcf->domains.elts;
    ngx_uint_t   i;

    for (i = 0; i < mcf->domains.nelts; i++) {
        if (smk_str_eq(&d[i], name)) {
            return i;
        }
    }
    return NGX_ERROR;
}


static ngx_int_t
smk_domain_index(smk_main_conf_t *mcf, ngx_str_t *name)
{
    ngx_int_t   i = smk_domain_find(mcf, name);
    ngx_str_t  *d;

    if (i != NGX_ERROR || mcf->domains.nelts == SMK_MAX_DOMAINS) {
        return i;
    }
    d = ngx_array_push(&mcf->domains);
    *d = *name;     /* configuration strings end with a NUL: the topic is len + 1 */
    return mcf->domains.nelts - 1;
}


static char *
smk_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    smk_loc_conf_t            *prev = parent, *conf = child;
    smk_main_conf_t           *mcf;
    ngx_int_t                  idx;
    ngx_str_t                  value = ngx_string("$remote_addr");
    ngx_http_compile_complex_value_t  ccv;

    ngx_conf_merge_value(conf->enabled, prev->enabled, 0);
    ngx_conf_merge_str_value(conf->domain, prev->domain, "default");
    ngx_conf_merge_msec_value(conf->max_delay, prev->max_delay, 5000);
    ngx_conf_merge_uint_value(conf->status_code, prev->status_code, 503);
    ngx_conf_merge_ptr_value(conf->identifier, prev->identifier, NULL);
    ngx_conf_merge_ptr_value(conf->log_info, prev->log_info, NULL);

    if (conf->status_code != 503 && conf->status_code != 429) {
        return "smockron_status_code must be 503 or 429";
    }
    if (!conf->enabled) {
        return NGX_CONF_OK;
    }
    if (conf->domain.len == 0 || conf->domain.len > SMK_MAX_DOMAIN
        || ngx_strlchr(conf->domain.data, conf->domain.data + conf->domain.len, '\0'))
    {
        return "smockron_domain must be 1 to 256 bytes, without NUL";
    }
    if (conf->identifier == NULL) {
        conf->identifier = ngx_palloc(cf->pool, sizeof(ngx_http_complex_value_t));
        if (conf->identifier == NULL) {
            return NGX_CONF_ERROR;
        }
        ngx_memzero(&ccv, sizeof(ccv));
        ccv.cf = cf;
        ccv.value = &value;
        ccv.complex_value = conf->identifier;
        if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
            return NGX_CONF_ERROR;
        }
    }
    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_smockron_module);
    idx = smk_domain_index(mcf, &conf->domain);
    if (idx == NGX_ERROR) {
        return "names more than 64 domains";
    }
    conf->domain_idx = idx;
    return NGX_CONF_OK;
}


/* The first line of rules (see _firstline.py's Line.of): one GCRA per distinct rule. */
static ngx_int_t
smk_make_line(smk_line_t *line, ngx_str_t *algorithm, double *rates, ngx_uint_t *bursts,
    ngx_uint_t n)
{
    ngx_uint_t  i, j, k, slack;

    if (smk_is(algorithm->data, algorithm->len, "gcra")) {
        slack = 0;
    } else if (smk_is(algorithm->data, algorithm->len, "history")
               || smk_is(algorithm->data, algorithm->len, "history-literal"))
    {
        slack = 1;  /* a cold identifier gets exactly burst at once */
    } else {
        return NGX_ERROR;
    }
    k = 0;
    for (i = 0; i < n; i++) {
        for (j = 0; j < i; j++) {
            if (rates[j] == rates[i] && bursts[j] == bursts[i]) {
                break;
            }
        }
        if (j < i) {
            continue;
        }
        line->interval[k] = 1000.0 / rates[i];
        line->tolerance[k] = (double) (bursts[i] - slack) * line->interval[k];
        if (k == 0 || line->interval[k] < line->interval[line->fastest]) {
            line->fastest = k;
        }
        k++;
    }
    line->nrules = k;
    return NGX_OK;
}


/* Install a line in the zone (lock held); a changed one restarts its identifiers. */
static void
smk_set_line(ngx_uint_t d, smk_line_t *line)
{
    smk_line_t  *old = &smk_sh->lines[d];

    if (old->nrules == line->nrules && old->fastest == line->fastest
        && ngx_memcmp(old->interval, line->interval, line->nrules * sizeof(double)) == 0
        && ngx_memcmp(old->tolerance, line->tolerance, line->nrules * sizeof(double)) == 0)
    {
        return;
    }
    line->gen = old->gen + 1;
    *old = *line;
}


static ngx_int_t
smk_configured_lines(ngx_conf_t *cf, smk_main_conf_t *mcf)
{
    ngx_str_t    *domains = mcf->domains.elts, *algs, alg, name;
    smk_rule_t   *rules = mcf->rules.elts;
    double        rates[SMK_MAX_RULES];
    ngx_uint_t    bursts[SMK_MAX_RULES], d, i, n;
    u_char       *eq;

    mcf->configured = ngx_pcalloc(cf->pool, SMK_MAX_DOMAINS * sizeof(smk_line_t));
    if (mcf->configured == NULL) {
        return NGX_ERROR;
    }
    for (i = 0; i < mcf->rules.nelts; i++) {
        if (smk_domain_find(mcf, &rules[i].domain) == NGX_ERROR) {
            ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                               "smockron_rule for \"%V\", which no location serves",
                               &rules[i].domain);
        }
    }
    for (d = 0; d < mcf->domains.nelts; d++) {
        n = 0;
        for (i = 0; i < mcf->rules.nelts && n < SMK_MAX_RULES; i++) {
            if (smk_str_eq(&domains[d], &rules[i].domain)) {
                rates[n] = rules[i].rate;
                bursts[n++] = rules[i].burst;
            }
        }
        ngx_str_set(&alg, "history");
        if (mcf->algorithms != NGX_CONF_UNSET_PTR) {
            algs = mcf->algorithms->elts;
            for (i = 0; i < mcf->algorithms->nelts; i++) {
                eq = ngx_strlchr(algs[i].data, algs[i].data + algs[i].len, '=');
                if (eq == NULL) {
                    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                       "smockron_algorithm expects DOMAIN=ALGORITHM");
                    return NGX_ERROR;
                }
                name.data = algs[i].data;
                name.len = eq - algs[i].data;
                if (smk_str_eq(&name, &domains[d])) {
                    alg.data = eq + 1;
                    alg.len = algs[i].data + algs[i].len - eq - 1;
                }
            }
        }
        if (smk_make_line(&mcf->configured[d], &alg, rates, bursts, n) != NGX_OK) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "smockron_algorithm: unknown \"%V\": "
                               "use history, gcra or history-literal", &alg);
            return NGX_ERROR;
        }
    }
    return NGX_OK;
}


/* ---- the shared zone ---------------------------------------------------------------- */

static void
smk_free_node(smk_node_t *n)
{
    ngx_queue_remove(&n->queue);
    ngx_rbtree_delete(&smk_sh->rbtree, &n->rb);
    ngx_slab_free_locked(smk_shpool, n);
    smk_sh->entries--;
}


/* The least recently used entry (the queue is not empty). */
#define smk_oldest()  ngx_queue_data(ngx_queue_last(&smk_sh->queue), smk_node_t, queue)


static void
smk_wipe(void)
{
    while (!ngx_queue_empty(&smk_sh->queue)) {
        smk_free_node(smk_oldest());
    }
    smk_sh->entries = 0;
}


/* Order by hash, then domain and identifier: smk_lookup walks the same way. */
static void
smk_rbtree_insert(ngx_rbtree_node_t *temp, ngx_rbtree_node_t *node,
    ngx_rbtree_node_t *sentinel)
{
    ngx_rbtree_node_t  **p;
    smk_node_t          *a = (smk_node_t *) node, *b;
    ngx_int_t            rc;

    for ( ;; ) {
        if (node->key != temp->key) {
            p = node->key < temp->key ? &temp->left : &temp->right;
        } else {
            b = (smk_node_t *) temp;
            rc = (ngx_int_t) a->domain - (ngx_int_t) b->domain;
            if (rc == 0) {
                rc = ngx_memn2cmp(smk_node_ident(a), smk_node_ident(b), a->len, b->len);
            }
            p = rc < 0 ? &temp->left : &temp->right;
        }
        if (*p == sentinel) {
            break;
        }
        temp = *p;
    }
    *p = node;
    node->parent = temp;
    node->left = sentinel;
    node->right = sentinel;
    ngx_rbt_red(node);
}


static ngx_int_t
smk_shm_init(ngx_shm_zone_t *zone, void *data)
{
    smk_main_conf_t  *mcf = zone->data, *old = data;
    ngx_str_t        *domains = mcf->domains.elts;
    ngx_uint_t        d, same;

    smk_shpool = (ngx_slab_pool_t *) zone->shm.addr;
    if (old != NULL || zone->shm.exists) {     /* a reload: the zone lives on */
        smk_sh = smk_shpool->data;
    } else {
        smk_sh = ngx_slab_alloc(smk_shpool, sizeof(smk_shctx_t));
        if (smk_sh == NULL) {
            return NGX_ERROR;
        }
        ngx_memzero(smk_sh, sizeof(smk_shctx_t));
        smk_shpool->data = smk_sh;
        ngx_rbtree_init(&smk_sh->rbtree, &smk_sh->sentinel, smk_rbtree_insert);
        ngx_queue_init(&smk_sh->queue);
        smk_shpool->log_nomem = 0;  /* a full zone evicts: not worth a log line */
    }
    /* a reload loads this module again, maybe elsewhere: the old pointer is stale */
    smk_sh->rbtree.insert = smk_rbtree_insert;

    /* a reload may have renumbered the domains: then the old entries mean nothing */
    same = smk_sh->ndomains == mcf->domains.nelts;
    for (d = 0; same && d < mcf->domains.nelts; d++) {
        same = smk_eq(smk_sh->names[d], ngx_strlen(smk_sh->names[d]), domains[d].data,
                      domains[d].len);
    }
    ngx_shmtx_lock(&smk_shpool->mutex);
    if (!same) {
        smk_wipe();
        smk_sh->ndomains = mcf->domains.nelts;
        for (d = 0; d < mcf->domains.nelts; d++) {
            ngx_memcpy(smk_sh->names[d], domains[d].data, domains[d].len);
            smk_sh->names[d][domains[d].len] = '\0';
        }
    }
    for (d = 0; d < mcf->domains.nelts; d++) {
        smk_set_line(d, &mcf->configured[d]);
    }
    ngx_shmtx_unlock(&smk_shpool->mutex);
    return NGX_OK;
}


static ngx_int_t
smk_init(ngx_conf_t *cf)
{
    smk_main_conf_t           *mcf;
    ngx_http_core_main_conf_t *cmcf;
    ngx_http_handler_pt       *h;
    ngx_str_t                  name = ngx_string("smockron");

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_smockron_module);
    if (mcf->domains.nelts == 0) {
        return NGX_OK;  /* loaded but used nowhere */
    }
    if (smk_configured_lines(cf, mcf) != NGX_OK) {
        return NGX_ERROR;
    }
    mcf->zone = ngx_shared_memory_add(cf, &name, mcf->shm_size, &ngx_http_smockron_module);
    if (mcf->zone == NULL) {
        return NGX_ERROR;
    }
    mcf->zone->init = smk_shm_init;
    mcf->zone->data = mcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);
    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PREACCESS_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }
    *h = smk_handler;
    return NGX_OK;
}


static uint32_t
smk_hash(ngx_uint_t d, u_char *ident, size_t len)
{
    return ngx_crc32_short(ident, len) ^ (uint32_t) (d * 0x9e3779b1u);
}


/* The identifier's entry, most recently used now; NULL if none. Lock held. */
static smk_node_t *
smk_lookup(ngx_uint_t d, u_char *ident, size_t len, uint32_t hash)
{
    ngx_rbtree_node_t  *node = smk_sh->rbtree.root, *sentinel = smk_sh->rbtree.sentinel;
    smk_node_t         *n;
    ngx_int_t           rc;

    while (node != sentinel) {
        if (hash != node->key) {
            node = hash < node->key ? node->left : node->right;
            continue;
        }
        n = (smk_node_t *) node;
        rc = (ngx_int_t) d - (ngx_int_t) n->domain;
        if (rc == 0) {
            rc = ngx_memn2cmp(ident, smk_node_ident(n), len, n->len);
        }
        if (rc == 0) {
            ngx_queue_remove(&n->queue);
            ngx_queue_insert_head(&smk_sh->queue, &n->queue);
            return n;
        }
        node = rc < 0 ? node->left : node->right;
    }
    return NULL;
}


static ngx_int_t
smk_passed(smk_node_t *n, int64_t now)
{
    ngx_uint_t  i;

    if (n->until > now || n->next_free > now) {
        return 0;
    }
    for (i = 0; i < n->cap; i++) {
        if (n->tat[i] > now) {
            return 0;
        }
    }
    return 1;
}


/* Forget up to two least recently used entries that have passed (as limit_req):
 * each request pays for the sweep a little at a time. Lock held. */
static void
smk_expire(int64_t now)
{
    ngx_uint_t   i;
    smk_node_t  *n;

    for (i = 0; i < 2 && !ngx_queue_empty(&smk_sh->queue); i++) {
        n = smk_oldest();
        if (!smk_passed(n, now)) {
            return;
        }
        smk_free_node(n);
    }
}


static smk_node_t *
smk_alloc(ngx_uint_t d, u_char *ident, size_t len, uint32_t hash, ngx_uint_t cap)
{
    size_t       size;
    smk_node_t  *n;
    ngx_uint_t   i;

    size = offsetof(smk_node_t, tat) + (cap ? cap : 1) * sizeof(double) + len;
    n = ngx_slab_alloc_locked(smk_shpool, size);
    /* full: the least recently used make room, passed or not (counted), a few at a
     * time, so a flood of made-up identifiers cannot keep real verdicts out */
    for (i = 0; n == NULL && i < 64 && !ngx_queue_empty(&smk_sh->queue); i++) {
        smk_free_node(smk_oldest());
        smk_count(SMK_DELAY_TABLE_EVICTED);
        n = ngx_slab_alloc_locked(smk_shpool, size);
    }
    if (n == NULL) {
        return NULL;
    }
    n->rb.key = hash;
    n->domain = (uint16_t) d;
    n->len = (uint16_t) len;
    n->cap = (uint8_t) cap;
    n->gen = 0;
    n->until = 0;
    n->next_free = SMK_NEVER;
    ngx_memcpy(smk_node_ident(n), ident, len);
    ngx_rbtree_insert(&smk_sh->rbtree, &n->rb);
    ngx_queue_insert_head(&smk_sh->queue, &n->queue);
    smk_sh->entries++;
    return n;
}


/* The entry with room for the domain's line and times that belong to it (they start
 * afresh when the line changed); created when `create`. NULL when there is none, or
 * no memory. Lock held. */
static smk_node_t *
smk_entry(ngx_uint_t d, u_char *ident, size_t len, ngx_uint_t create)
{
    uint32_t     hash = smk_hash(d, ident, len);
    smk_line_t  *line = &smk_sh->lines[d];
    smk_node_t  *n, *fresh;
    ngx_uint_t   i;
    int64_t      until;

    n = smk_lookup(d, ident, len, hash);
    if (n == NULL) {
        if (!create) {
            return NULL;
        }
        n = smk_alloc(d, ident, len, hash, line->nrules);
        if (n == NULL) {
            return NULL;
        }
    }
    if (n->gen == line->gen) {
        return n;
    }
    if (n->cap < line->nrules) {    /* freed first: making room may evict */
        until = n->until;
        smk_free_node(n);
        fresh = smk_alloc(d, ident, len, hash, line->nrules);
        if (fresh == NULL) {
            return NULL;
        }
        fresh->until = until;
        n = fresh;
    }
    for (i = 0; i < n->cap; i++) {
        n->tat[i] = SMK_NEVER;
    }
    n->next_free = SMK_NEVER;
    n->gen = line->gen;
    return n;
}


/* ---- the decision (_decider.py's Decider) ------------------------------------------- */

enum { SMK_NONE, SMK_ACCEPT, SMK_DELAY, SMK_REJECT };

/* what an accepted or rejected request keeps: no allocation on those paths */
static smk_ctx_t  smk_accepted = { .done = 1, .verdict = SMK_ACCEPT };
static smk_ctx_t  smk_rejected = { .done = 1, .verdict = SMK_REJECT };

static int64_t
smk_ceil_ms(double t)
{
    int64_t  whole = (int64_t) t;

    return whole + (whole < t);     /* a DELAY_UNTIL is never early */
}


/* Accept, delay until *until (paced: by the first line) or reject. Lock held. */
static ngx_uint_t
smk_decide(ngx_uint_t d, ngx_str_t *ident, int64_t now, ngx_msec_t max_delay,
    int64_t *until, ngx_uint_t *paced)
{
    smk_line_t  *line = &smk_sh->lines[d];
    smk_node_t  *n;
    double       at, cur[SMK_MAX_RULES];
    ngx_uint_t   i, k, can_wait;
    int64_t      wait;

    smk_expire(now);
    *paced = 0;
    can_wait = smk_sh->waiting < smk_mcf->max_delayed;

    if (line->nrules == 0) {    /* the master's DELAY_UNTIL alone, as the original */
        n = smk_entry(d, ident->data, ident->len, 0);
        *until = n ? n->until : 0;
        if (*until <= now) {
            return SMK_ACCEPT;
        }
        if (*until - now <= (int64_t) max_delay && can_wait) {
            ngx_atomic_fetch_add(&smk_sh->waiting, 1);
            return SMK_DELAY;
        }
        return SMK_REJECT;
    }

    n = smk_entry(d, ident->data, ident->len, 1);
    if (n == NULL) {
        *until = 0;
        return SMK_ACCEPT;  /* no memory even after evicting: fail open */
    }
    k = line->fastest;
    for (i = 0; i < line->nrules; i++) {
        cur[i] = n->tat[i];
    }
    if (n->until > now && n->tat[k] < n->until + line->tolerance[k]) {
        cur[k] = n->until + line->tolerance[k];     /* used up until then */
    }
    at = (double) now;
    for (i = 0; i < line->nrules; i++) {
        if (cur[i] - line->tolerance[i] > at) {
            at = cur[i] - line->tolerance[i];
        }
    }
    if (at > now) {
        wait = smk_ceil_ms(at);
        *until = wait;
        if (wait - now > (int64_t) max_delay || !can_wait) {
            return SMK_REJECT;  /* takes no slot */
        }
    }
    for (i = 0; i < line->nrules; i++) {
        n->tat[i] = (cur[i] > at ? cur[i] : at) + line->interval[i];
    }
    if (at <= now) {
        *until = 0;
        return SMK_ACCEPT;
    }
    ngx_atomic_fetch_add(&smk_sh->waiting, 1);
    *paced = 1;
    return SMK_DELAY;
}


/* The first line used up until `t`: no burst on top of a master's DELAY_UNTIL, nor
 * for a client whose requests wait their turn. */
static ngx_inline void
smk_hold(smk_line_t *line, smk_node_t *n, double t)
{
    ngx_uint_t  k = line->fastest;
    double      floor = t + line->tolerance[k];

    if (line->nrules && k < n->cap && n->tat[k] < floor) {
        n->tat[k] = floor;
    }
}


/* A paced request woke (Decider.recheck): 0 go, -1 reject, else sleep until then. */
static int64_t
smk_recheck(ngx_uint_t d, smk_ctx_t *ctx, int64_t now)
{
    smk_line_t  *line = &smk_sh->lines[d];
    smk_node_t  *n;
    double       slot;
    int64_t      wait;

    n = smk_entry(d, ctx->ident.data, ctx->ident.len, 0);
    if (n == NULL) {
        return 0;
    }
    if (n->until <= now && (ctx->held || n->next_free <= now)) {
        return 0;
    }
    slot = (double) n->until > n->next_free ? (double) n->until : n->next_free;
    wait = smk_ceil_ms(slot);
    if (wait - ctx->received > (int64_t) ctx->conf->max_delay) {
        smk_count(SMK_REJECTED_AFTER_DELAY);
        return -1;
    }
    if (line->nrules) {     /* the requests waiting here go one at a time */
        n->next_free = slot + line->interval[line->fastest];
        smk_hold(line, n, n->next_free);
    }
    smk_count(SMK_DELAYED_AGAIN);
    return wait;
}


/* A DELAY_UNTIL from the master: keep the latest, and hold the first line to it. */
static void
smk_apply(ngx_uint_t d, u_char *ident, size_t len, int64_t until, int64_t now)
{
    smk_node_t  *n;

    ngx_shmtx_lock(&smk_shpool->mutex);
    n = smk_entry(d, ident, len, until > now);
    if (n != NULL && until > n->until) {
        n->until = until;
        smk_hold(&smk_sh->lines[d], n, (double) until);
    }
    ngx_shmtx_unlock(&smk_shpool->mutex);
}


/* ---- accounting ----------------------------------------------------------------------- */

static ngx_int_t
smk_send(const void *data, size_t len, int more)
{
    return zmq_send(smk_acc, data, len, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) < 0
           ? NGX_ERROR : NGX_OK;
}


/* Accounting waits here up to 5 ms (or 256 messages) and goes in one burst: each
 * burst wakes ZeroMQ's I/O thread once, and at 2 ms those wake-ups cost about as much
 * CPU as nginx spends proxying the request (the asyncio gatekeeper's flush_delay, for
 * the same reason). The master hears of a request at most 5 ms later; the first line
 * holds the client meanwhile. */
#define SMK_BATCH        256
#define SMK_ARENA        (SMK_BATCH * 1024)
#define SMK_FLUSH_MS     5

typedef struct {
    u_char                     *frame[6];
    size_t                      len[6];
    ngx_uint_t                  n;
} smk_msg_t;

static smk_msg_t    smk_queue[SMK_BATCH];
static ngx_uint_t   smk_queued;
static u_char      *smk_arena;
static size_t       smk_arena_used;
static ngx_event_t  smk_flush_ev;


static void
smk_flush(void)
{
    ngx_uint_t   i, j, sent = 0, dropped = 0;
    smk_msg_t   *m;

    for (i = 0; i < smk_queued; i++) {
        m = &smk_queue[i];
        /* the first frame at the high-water mark fails (XPUB_NODROP): counted; once
         * it went, the message goes whole */
        if (smk_send(m->frame[0], m->len[0], 1) != NGX_OK) {
            dropped++;
            continue;
        }
        for (j = 1; j < m->n; j++) {
            smk_send(m->frame[j], m->len[j], j + 1 < m->n);
        }
        sent++;
    }
    smk_queued = 0;
    smk_arena_used = 0;
    if (smk_flush_ev.timer_set) {
        ngx_del_timer(&smk_flush_ev);
    }
    ngx_atomic_fetch_add(&smk_sh->counters[SMK_ACCOUNTING_SENT], sent);
    ngx_atomic_fetch_add(&smk_sh->counters[SMK_ACCOUNTING_DROPPED], dropped);
}


static void
smk_on_flush(ngx_event_t *ev)
{
    smk_flush();
}


/* The message's next frame, a copy in the arena. */
static void
smk_keep(smk_msg_t *m, const void *data, size_t len)
{
    u_char  *p = smk_arena + smk_arena_used;

    ngx_memcpy(p, data, len);
    smk_arena_used += len;
    m->frame[m->n] = p;
    m->len[m->n++] = len;
}


/* One accounting message, queued; never blocks. While the master's subscription is not
 * here, a message would be dropped unseen by the socket: it is counted as dropped. */
static void
smk_account(smk_loc_conf_t *lcf, const char *status, ngx_str_t *ident, int64_t received,
    int64_t delayed, ngx_str_t *loginfo)
{
    u_char      rbuf[NGX_INT64_LEN], dbuf[NGX_INT64_LEN];
    size_t      rlen, dlen = 0, slen = ngx_strlen(status), size;
    smk_msg_t  *m;

    if (smk_acc == NULL || !smk_subscribed) {
        smk_count(SMK_ACCOUNTING_DROPPED);
        return;
    }
    rlen = ngx_sprintf(rbuf, "%L", received) - rbuf;
    if (delayed) {
        dlen = ngx_sprintf(dbuf, "%L", delayed) - dbuf;
    }
    size = lcf->domain.len + 1 + slen + ident->len + rlen + dlen
           + (loginfo ? loginfo->len : 0);
    if (smk_queued == SMK_BATCH || smk_arena_used + size > SMK_ARENA) {
        smk_flush();
    }
    m = &smk_queue[smk_queued++];
    m->n = 0;
    smk_keep(m, lcf->domain.data, lcf->domain.len + 1);
    smk_keep(m, status, slen);
    smk_keep(m, ident->data, ident->len);
    smk_keep(m, rbuf, rlen);
    smk_keep(m, dbuf, dlen);
    if (loginfo != NULL) {
        smk_keep(m, loginfo->data, loginfo->len);
    }
    if (!smk_flush_ev.timer_set) {
        ngx_add_timer(&smk_flush_ev, SMK_FLUSH_MS);
    }
}


static void
smk_account_rejected(smk_loc_conf_t *lcf, ngx_str_t *ident, int64_t received,
    ngx_str_t *loginfo)
{
    /* a credit accumulator: 0.25 reports exactly every fourth rejection */
    smk_reject_credit += smk_mcf->reject_sample;
    if (smk_reject_credit < 1.0) {
        smk_count(SMK_ACCOUNTING_SAMPLED_OUT);
        return;
    }
    smk_reject_credit -= 1.0;
    smk_account(lcf, "REJECTED", ident, received, 0, loginfo);
}


/* ---- requests ------------------------------------------------------------------------- */

/* Whether Accept names JSON problem details (RFC 9457) with q > 0, as httpgate's
 * wants_problem_json: an unparsable q counts as 0 (the header is the client's). */
static ngx_uint_t
smk_wants_json(ngx_http_request_t *r)
{
    ngx_list_part_t  *part = &r->headers_in.headers.part;
    ngx_table_elt_t  *h = part->elts;
    ngx_uint_t        i;
    u_char           *p, *end, *item, *semi, *q;
    size_t            len;
    double            quality;

    for (i = 0; /* void */; i++) {
        if (i >= part->nelts) {
            if (part->next == NULL) {
                return 0;
            }
            part = part->next;
            h = part->elts;
            i = 0;
        }
        if (!smk_caseis(h[i].key.data, h[i].key.len, "accept")) {
            continue;
        }
        p = h[i].value.data;
        end = p + h[i].value.len;
        while (p < end) {
            item = p;
            while (p < end && *p != ',') {
                p++;
            }
            semi = ngx_strlchr(item, p, ';');
            while (item < p && *item == ' ') {
                item++;
            }
            len = (semi ? semi : p) - item;
            while (len > 0 && item[len - 1] == ' ') {
                len--;
            }
            if (smk_caseis(item, len, "application/problem+json")
                || smk_caseis(item, len, "application/json"))
            {
                quality = 1.0;
                q = semi ? ngx_strlcasestrn(semi, p, (u_char *) "q=", 1) : NULL;
                if (q != NULL) {
                    quality = ngx_atofp(q + 2, p - q - 2, 3);   /* NGX_ERROR: 0 */
                }
                if (quality > 0) {
                    return 1;
                }
            }
            p++;
        }
    }
}


/* Send `b` as the whole body, after the headers. */
static ngx_inline ngx_int_t
smk_send_body(ngx_http_request_t *r, ngx_buf_t *b)
{
    ngx_int_t    rc;
    ngx_chain_t  out;

    b->last_in_chain = 1;
    r->headers_out.content_length_n = b->last - b->pos;
    rc = ngx_http_send_header(r);
    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }
    out.buf = b;
    out.next = NULL;
    return ngx_http_output_filter(r, &out);
}


static ngx_int_t
smk_respond(ngx_http_request_t *r, smk_loc_conf_t *lcf, int64_t wait_ms)
{
    ngx_int_t         retry;
    ngx_buf_t        *b;
    ngx_table_elt_t  *h;
    const char       *title;

    retry = wait_ms <= 1000 ? 1 : (wait_ms + 999) / 1000;   /* never 0: no retry storm */
    title = lcf->status_code == 429 ? "Too Many Requests" : "Service Unavailable";
    b = ngx_create_temp_buf(r->pool, 160);
    h = ngx_list_push(&r->headers_out.headers);
    if (b == NULL || h == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    h->hash = 1;
    ngx_str_set(&h->key, "Retry-After");
    h->value.data = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
    if (h->value.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    h->value.len = ngx_sprintf(h->value.data, "%i", retry) - h->value.data;
    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    h->hash = 1;
    ngx_str_set(&h->key, "Cache-Control");
    ngx_str_set(&h->value, "no-store");

    if (smk_wants_json(r)) {
        b->last = ngx_sprintf(b->last, "{\"type\": \"about:blank\", \"title\": \"%s\", "
                              "\"status\": %ui, \"detail\": \"rate limited: retry after "
                              "%i s\"}", title, lcf->status_code, retry);
        ngx_str_set(&r->headers_out.content_type, "application/problem+json");
    } else {
        b->last = ngx_sprintf(b->last, "%ui %s: rate limited: retry after %i s\n",
                              lcf->status_code, title, retry);
        ngx_str_set(&r->headers_out.content_type, "text/plain; charset=utf-8");
        r->headers_out.content_type_len = sizeof("text/plain") - 1;
    }
    b->last_buf = (r == r->main);
    if (ngx_http_discard_request_body(r) != NGX_OK) {
        r->keepalive = 0;
    }
    r->headers_out.status = lcf->status_code;
    return smk_send_body(r, b);
}


/* Answer the rejection and end the request here: a phase handler's NGX_OK would run
 * the next phases (the upstream) after it. */
static ngx_int_t
smk_reject(ngx_http_request_t *r, smk_loc_conf_t *lcf, int64_t wait_ms)
{
    ngx_http_finalize_request(r, smk_respond(r, lcf, wait_ms));
    return NGX_DONE;
}


static void
smk_release(void *data)
{
    smk_ctx_t  *ctx = data;

    if (ctx->waiting) {     /* gone through, rejected, or the client left */
        ctx->waiting = 0;
        ngx_atomic_fetch_add(&smk_sh->waiting, -1);
    }
}


static void
smk_wake(ngx_http_request_t *r)
{
    ngx_event_t  *wev = r->connection->write;

    if (wev->delayed) {     /* woken by the socket, not the timer */
        if (ngx_handle_write_event(wev, 0) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        }
        return;
    }
    if (ngx_handle_read_event(r->connection->read, 0) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }
    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);    /* back to smk_handler, which sees the ctx */
}


/* Hold the request on a timer, as limit_req does: the worker goes on serving. */
static ngx_int_t
smk_sleep(ngx_http_request_t *r, int64_t ms)
{
    if (ngx_handle_read_event(r->connection->read, 0) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    r->read_event_handler = ngx_http_test_reading;     /* notices a client that left */
    r->write_event_handler = smk_wake;
    r->connection->write->delayed = 1;
    ngx_add_timer(r->connection->write, (ngx_msec_t) (ms > 0 ? ms : 1));
    return NGX_AGAIN;
}


static ngx_int_t
smk_identify(ngx_http_request_t *r, smk_loc_conf_t *lcf, ngx_str_t *ident,
    ngx_str_t *loginfo)
{
    u_char  digest[32], *p;

    if (ngx_http_complex_value(r, lcf->identifier, ident) != NGX_OK) {
        return NGX_ERROR;
    }
    if (ident->len > SMK_MAX_IDENTIFIER) {
        /* what every smockron gatekeeper sends for it (wire_identifier): the master
         * limits the client as one, and two long ones that share a prefix stay two */
        crypto_generichash(digest, 32, ident->data, ident->len, NULL, 0);
        p = ngx_pnalloc(r->pool, 8 + 64);
        if (p == NULL) {
            return NGX_ERROR;
        }
        ngx_memcpy(p, "blake2b:", 8);
        ngx_hex_dump(p + 8, digest, 32);
        ident->data = p;
        ident->len = 72;
        smk_count(SMK_IDENTIFIERS_HASHED);
    }
    if (lcf->log_info != NULL) {
        if (ngx_http_complex_value(r, lcf->log_info, loginfo) != NGX_OK) {
            return NGX_ERROR;
        }
        if (loginfo->len > SMK_MAX_LOGINFO) {
            loginfo->len = SMK_MAX_LOGINFO;
        }
    }
    return NGX_OK;
}


/* A delayed request woke up (_decider.py's Waiting.woke). */
static ngx_int_t
smk_woke(ngx_http_request_t *r, smk_ctx_t *ctx)
{
    smk_loc_conf_t  *lcf = ctx->conf;
    int64_t          now = smk_now_ms(), went = ctx->until, next;
    ngx_str_t       *loginfo = lcf->log_info ? &ctx->loginfo : NULL;

    next = 0;
    if (now - ctx->received > (int64_t) lcf->max_delay) {
        /* the worker was busy past the longest delay: a promise to the client */
        smk_count(SMK_REJECTED_AFTER_DELAY);
        next = -1;
    } else if (ctx->tries > 0) {
        ctx->tries--;
        ngx_shmtx_lock(&smk_shpool->mutex);
        next = smk_recheck(lcf->domain_idx, ctx, now);
        ngx_shmtx_unlock(&smk_shpool->mutex);
        ctx->held = 1;
    }
    if (next > 0) {
        ctx->until = next;
        return smk_sleep(r, next - now);
    }
    ctx->done = 1;
    smk_release(ctx);
    if (next < 0) {
        ctx->verdict = SMK_REJECT;
        return smk_reject(r, lcf, ctx->until - ctx->received);
    }
    if (ctx->paced) {   /* charged when it goes, with the time it went */
        smk_account(lcf, "DELAYED", &ctx->ident, ctx->received, went, loginfo);
    }
    return NGX_DECLINED;
}


static ngx_int_t
smk_handler(ngx_http_request_t *r)
{
    smk_loc_conf_t      *lcf;
    smk_ctx_t           *ctx;
    ngx_str_t            ident, loginfo, *li;
    int64_t              now, until;
    ngx_uint_t           verdict, paced;
    ngx_pool_cleanup_t  *cln;

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_smockron_module);
    if (!lcf->enabled || r->internal || smk_sh == NULL) {
        return NGX_DECLINED;
    }
    ctx = ngx_http_get_module_ctx(r, ngx_http_smockron_module);
    if (ctx != NULL) {
        return ctx->done ? NGX_DECLINED : smk_woke(r, ctx);
    }

    ngx_str_null(&loginfo);
    if (smk_identify(r, lcf, &ident, &loginfo) != NGX_OK) {
        return NGX_DECLINED;    /* our own failure lets the request through */
    }
    if (ident.len == 0) {
        return NGX_DECLINED;    /* no identifier: not limited */
    }
    li = lcf->log_info ? &loginfo : NULL;
    now = smk_now_ms();

    ngx_shmtx_lock(&smk_shpool->mutex);
    verdict = smk_decide(lcf->domain_idx, &ident, now, lcf->max_delay, &until, &paced);
    ngx_shmtx_unlock(&smk_shpool->mutex);

    if (verdict == SMK_ACCEPT) {
        ngx_http_set_ctx(r, &smk_accepted, ngx_http_smockron_module);
        smk_count(SMK_ACCEPTED);
        smk_account(lcf, "ACCEPTED", &ident, now, 0, li);
        return NGX_DECLINED;
    }
    if (verdict == SMK_REJECT) {
        ngx_http_set_ctx(r, &smk_rejected, ngx_http_smockron_module);
        smk_count(SMK_REJECTED);
        smk_account_rejected(lcf, &ident, now, li);
        return smk_reject(r, lcf, until - now);
    }

    smk_count(SMK_DELAYED);
    ctx = ngx_pcalloc(r->pool, sizeof(smk_ctx_t));
    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (ctx == NULL || cln == NULL) {
        ngx_atomic_fetch_add(&smk_sh->waiting, -1);
        return NGX_DECLINED;
    }
    ctx->waiting = 1;
    ctx->verdict = SMK_DELAY;
    cln->handler = smk_release;
    cln->data = ctx;
    ctx->conf = lcf;
    ctx->received = now;
    ctx->until = until;
    ctx->paced = paced;
    ctx->tries = paced ? SMK_MAX_RECHECKS : 0;
    if (paced) {    /* accounted when it goes: keep what that message needs */
        ctx->ident.data = ngx_pstrdup(r->pool, &ident);
        ctx->ident.len = ident.len;
        ctx->loginfo.data = ngx_pstrdup(r->pool, &loginfo);
        ctx->loginfo.len = loginfo.len;
    } else {        /* the original gatekeepers' DELAYED: when decided */
        ctx->ident = ident;
        smk_account(lcf, "DELAYED", &ident, now, until, li);
    }
    ngx_http_set_ctx(r, ctx, ngx_http_smockron_module);
    return smk_sleep(r, until - now);
}


/* $smockron_decision: accept, delay or reject (empty when not decided here), for
 * `add_header X-Smockron-Decision $smockron_decision always;` or a log format. */
static ngx_int_t
smk_decision_variable(ngx_http_request_t *r, ngx_http_variable_value_t *v, uintptr_t data)
{
    static ngx_str_t  names[] = { ngx_null_string, ngx_string("accept"),
                                  ngx_string("delay"), ngx_string("reject") };
    smk_ctx_t        *ctx = ngx_http_get_module_ctx(r, ngx_http_smockron_module);

    if (ctx == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }
    v->data = names[ctx->verdict].data;
    v->len = names[ctx->verdict].len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    return NGX_OK;
}


static ngx_int_t
smk_preinit(ngx_conf_t *cf)
{
    ngx_str_t             name = ngx_string("smockron_decision");
    ngx_http_variable_t  *var;

    var = ngx_http_add_variable(cf, &name, NGX_HTTP_VAR_NOCACHEABLE);
    if (var == NULL) {
        return NGX_ERROR;
    }
    var->get_handler = smk_decision_variable;
    return NGX_OK;
}


/* ---- control (worker 0) ------------------------------------------------------------- */

/* Up to 64 bytes of hostile input as printable ASCII, for a log line. */
static u_char *
smk_escape(u_char *dst, u_char *src, size_t len)
{
    static u_char  hex[] = "0123456789abcdef";
    size_t         i;

    for (i = 0; i < len && i < 64; i++) {
        if (src[i] >= 0x20 && src[i] < 0x7f && src[i] != '\\' && src[i] != '"') {
            *dst++ = src[i];
        } else {
            *dst++ = '\\';
            *dst++ = 'x';
            *dst++ = hex[src[i] >> 4];
            *dst++ = hex[src[i] & 0xf];
        }
    }
    if (len > 64) {
        dst = ngx_cpymem(dst, "...", 3);
    }
    return dst;
}


/* Count a malformed control message; log at most one line per 10 s. */
static void
smk_malformed(const char *why, zmq_msg_t *frame, size_t nframes)
{
    u_char      text[64 * 4 + 4], *end;
    ngx_msec_t  now = ngx_current_msec;

    smk_count(SMK_CONTROL_MALFORMED);
    if (smk_malformed_logged && now - smk_malformed_logged < SMK_LOG_EVERY_MS) {
        smk_malformed_quiet++;
        return;
    }
    end = smk_escape(text, zmq_msg_data(frame), zmq_msg_size(frame));
    smk_warn("malformed control message ignored (%s), %uz frames, first \"%*s\"; %ui "
             "more since the last such line", why, nframes, (size_t) (end - text), text,
             smk_malformed_quiet);
    smk_malformed_logged = now ? now : 1;
    smk_malformed_quiet = 0;
}


/* ASCII decimal, nothing else, of 1 to `digits` digits and at most `max`; else -1.
 * A timestamp: codec.py's decode_timestamp; a publish counter: up to 20 digits
 * (codec.py's MAX_COUNT_DIGITS), one past what this side counts in (2^63) refused. */
static int64_t
smk_decimal(u_char *p, size_t len, size_t digits, int64_t max)
{
    uint64_t  v = 0;
    size_t    i;

    if (len == 0 || len > digits) {
        return -1;
    }
    for (i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9' || v > (UINT64_MAX - 9) / 10) {
            return -1;
        }
        v = v * 10 + (p[i] - '0');
    }
    return v > (uint64_t) max ? -1 : (int64_t) v;
}

#define smk_timestamp(f)  smk_decimal(zmq_msg_data(f), zmq_msg_size(f), 16, SMK_MAX_TS)
#define smk_counter(f)    smk_decimal(zmq_msg_data(f), zmq_msg_size(f), 20, INT64_MAX)


static ngx_int_t
smk_domain_of(u_char *name, size_t len)
{
    ngx_uint_t  d;

    for (d = 0; d < smk_sh->ndomains; d++) {
        if (smk_eq(smk_sh->names[d], ngx_strlen(smk_sh->names[d]), name, len)) {
            return d;
        }
    }
    return -1;
}


static void
smk_resync_soon(ngx_uint_t d)
{
    smk_streams[d].resync_left = SMK_RESYNC_TRIES;
    smk_streams[d].resync_at = ngx_current_msec;
}


/* RESYNCs due: the first at once, the next 50 ms later (the first often beats the
 * master's subscription), then every 250 ms until RESYNCSTART, 8 at most. */
static void
smk_resync_due(void)
{
    ngx_uint_t      d, private;
    smk_stream_t   *s;
    u_char         *name;

    for (d = 0; d < smk_sh->ndomains; d++) {
        s = &smk_streams[d];
        if (s->resync_left == 0 || (ngx_msec_int_t) (ngx_current_msec - s->resync_at) < 0) {
            continue;
        }
        if (!smk_subscribed) {
            continue;   /* it would be dropped unseen: try when the master is here */
        }
        name = smk_sh->names[d];
        /* a private answer first (only we receive it), then, for a master that never
         * answers those (an original one), the bare RESYNC every gatekeeper gets */
        private = SMK_RESYNC_TRIES - s->resync_left < SMK_PRIVATE_TRIES;
        if (smk_send(name, ngx_strlen(name) + 1, 1) == NGX_OK) {
            smk_send("RESYNC", 6, private);
            if (private) {
                smk_send(s->reply, s->reply_len, 0);
            }
            smk_count(SMK_RESYNCS_SENT);
        }
        if (s->resync_left == 1) {
            smk_warn("no answer to RESYNC for \"%s\" yet: the master may not support it",
                     name);
        }
        s->resync_at = ngx_current_msec
                       + (s->resync_left == SMK_RESYNC_TRIES ? 50 : 250);
        s->resync_left--;
    }
}


static void
smk_rules_offer(zmq_msg_t *f, size_t n)
{
    smk_line_t   line;
    ngx_str_t    alg;
    double       rates[SMK_MAX_RULES];
    ngx_uint_t   bursts[SMK_MAX_RULES], i, j;
    u_char       buf[65], *space, *end, *p;
    size_t       len;
    ngx_int_t    d;

    if (n < 5) {
        smk_malformed("RULES offer without rules", &f[0], n);
        return;
    }
    p = zmq_msg_data(&f[2]);
    len = zmq_msg_size(&f[2]);
    if (len == 0 || len > SMK_MAX_DOMAIN || ngx_strlchr(p, p + len, '\0')) {
        smk_malformed("RULES offer for a bad domain", &f[2], n);
        return;
    }
    d = smk_domain_of(p, len);
    alg.data = zmq_msg_data(&f[3]);
    alg.len = zmq_msg_size(&f[3]);
    for (i = 4; i < n; i++) {
        len = zmq_msg_size(&f[i]);
        if (len > 64) {
            smk_malformed("RULES offer with a bad rule", &f[i], n);
            return;
        }
        ngx_memcpy(buf, zmq_msg_data(&f[i]), len);
        buf[len] = '\0';
        space = (u_char *) ngx_strchr(buf, ' ');
        j = i - 4;
        rates[j] = space ? strtod((char *) buf, (char **) &end) : 0;
        bursts[j] = 0;
        if (space && end == space && ngx_strchr(space + 1, ' ') == NULL
            && buf + len - space - 1 >= 1 && buf + len - space - 1 <= 9)
        {
            bursts[j] = ngx_atoi(space + 1, buf + len - space - 1);
        }
        if (space == NULL || end != space || !(rates[j] >= 1e-9 && rates[j] <= 1e9)
            || bursts[j] == (ngx_uint_t) NGX_ERROR || bursts[j] < 1)
        {
            smk_malformed("RULES offer with a bad rule", &f[i], n);
            return;
        }
    }
    ngx_memzero(&line, sizeof(line));
    if (smk_make_line(&line, &alg, rates, bursts, n - 4) != NGX_OK) {
        smk_malformed("RULES offer with an unknown algorithm", &f[3], n);
        return;
    }
    smk_count(SMK_RULES_RECEIVED);
    if (d < 0) {
        smk_count(SMK_CONTROL_IGNORED);
        return;
    }
    if (smk_mcf->master_rules) {
        ngx_shmtx_lock(&smk_shpool->mutex);
        smk_set_line(d, &line);
        ngx_shmtx_unlock(&smk_shpool->mutex);
    }
}


/* The master's publish counter: what it published and we never got was lost. */
static void
smk_published(zmq_msg_t *f, size_t n)
{
    ngx_int_t      d;
    int64_t        count;
    uint64_t       lost;
    smk_stream_t  *s;

    count = n == 4 ? smk_counter(&f[3]) : -1;
    if (n != 4 || count < 0) {
        smk_malformed("bad PUBLISHED", &f[n > 3 ? 3 : 0], n);
        return;
    }
    d = smk_domain_of(zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
    if (d < 0) {
        return;
    }
    s = &smk_streams[d];
    if (s->heard && (uint64_t) count >= s->published) {
        lost = (uint64_t) count - s->published;
        lost = lost > s->received ? lost - s->received : 0;
        if (lost > 0) {
            ngx_atomic_fetch_add(&smk_sh->counters[SMK_CONTROL_LOST], lost);
            smk_warn("%uL DELAY_UNTILs for \"%s\" lost on the way; asking for a RESYNC",
                     lost, smk_sh->names[d]);
            smk_resync_soon(d);
        }
    }
    /* a lower counter is a restarted master: counting starts again */
    s->heard = 1;
    s->published = (uint64_t) count;
    s->received = 0;
}


/* The domain whose private RESYNC answers come on this topic, or -1. */
static ngx_int_t
smk_reply_of(u_char *topic, size_t len)
{
    ngx_uint_t  d;

    if (len <= SMK_REPLY_PREFIX_LEN
        || ngx_memcmp(topic, SMK_REPLY_PREFIX, SMK_REPLY_PREFIX_LEN) != 0)
    {
        return -1;
    }
    for (d = 0; d < smk_sh->ndomains; d++) {
        if (smk_eq(smk_streams[d].reply, smk_streams[d].reply_len, topic, len)) {
            return d;
        }
    }
    return -1;
}


static void
smk_control_message(zmq_msg_t *f, size_t n)
{
    u_char    *topic = zmq_msg_data(&f[0]), *cmd;
    size_t     tlen = zmq_msg_size(&f[0]), clen;
    ngx_int_t  d, private;
    int64_t    until, now;

    if (n > SMK_MAX_FRAMES) {
        smk_malformed("too many frames", &f[0], n);
        return;
    }
    if (n < 2) {
        smk_malformed("too few frames", &f[0], n);
        return;
    }
    cmd = zmq_msg_data(&f[1]);
    clen = zmq_msg_size(&f[1]);
    if (smk_is(topic, tlen, SMK_RULES_TOPIC)) {
        if (smk_is(cmd, clen, "RULES")) {
            smk_rules_offer(f, n);
        } else if (smk_is(cmd, clen, "PUBLISHED")) {
            smk_published(f, n);
        } else {
            smk_malformed("unknown command", &f[1], n);
        }
        return;
    }
    d = smk_reply_of(topic, tlen);  /* our private RESYNC's answer: as on its domain */
    private = d >= 0;
    if (!private) {
        if (tlen < 2 || tlen > SMK_MAX_DOMAIN + 1 || topic[tlen - 1] != '\0'
            || ngx_strlchr(topic, topic + tlen - 1, '\0'))
        {
            smk_malformed("bad domain frame", &f[0], n);
            return;
        }
        d = smk_domain_of(topic, tlen - 1);
    }
    if (smk_is(cmd, clen, "RESYNCSTART") || smk_is(cmd, clen, "RESYNCDONE")) {
        if (n != 2) {
            smk_malformed("resync mark with extra frames", &f[1], n);
        } else if (d >= 0 && clen == 11) {
            smk_streams[d].resync_left = 0;     /* answered: stop asking */
            if (private) {
                /* not in the master's publish count: the next counter is a baseline */
                smk_streams[d].heard = 0;
            }
        }
        return;
    }
    if (!smk_is(cmd, clen, "DELAY_UNTIL")) {
        smk_malformed("unknown command", &f[1], n);
        return;
    }
    if (n != 4) {
        smk_malformed("DELAY_UNTIL without 4 frames", &f[0], n);
        return;
    }
    if (zmq_msg_size(&f[2]) > SMK_MAX_IDENTIFIER) {
        smk_malformed("oversized identifier", &f[2], n);
        return;
    }
    until = smk_timestamp(&f[3]);
    if (until < 0) {
        smk_malformed("bad timestamp", &f[3], n);
        return;
    }
    if (d < 0) {
        smk_count(SMK_CONTROL_IGNORED);
        return;
    }
    smk_count(SMK_CONTROL_RECEIVED);
    smk_streams[d].received++;
    now = smk_now_ms();
    if (until - now > (int64_t) smk_mcf->max_ahead) {
        /* whoever took the control port cannot block a client for ever */
        smk_count(SMK_CONTROL_REFUSED);
        smk_warn("DELAY_UNTIL %L ms ahead refused (max %M ms)", until - now,
                 smk_mcf->max_ahead);
        return;
    }
    smk_apply(d, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), until, now);
}


/* ZMQ_FD signals edges, not levels: read until ZMQ_EVENTS says there is nothing. */
static void
smk_drain_control(void)
{
    zmq_msg_t   f[SMK_MAX_FRAMES], extra, *m;
    size_t      n, i;
    int         more, budget = 10000;

    while (smk_sub != NULL && budget-- > 0) {
        zmq_msg_init(&f[0]);
        if (zmq_msg_recv(&f[0], smk_sub, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f[0]);
            return;
        }
        n = 1;
        more = zmq_msg_more(&f[0]);
        while (more) {
            /* keep the frames a valid message can have, count the rest: a long
             * message costs bounded memory and is logged with its real length */
            m = n < SMK_MAX_FRAMES ? &f[n] : &extra;
            zmq_msg_init(m);
            zmq_msg_recv(m, smk_sub, 0);
            more = zmq_msg_more(m);
            if (m == &extra) {
                zmq_msg_close(m);
            }
            n++;
        }
        smk_control_message(f, n);
        for (i = 0; i < n && i < SMK_MAX_FRAMES; i++) {
            zmq_msg_close(&f[i]);
        }
    }
}


/* Whether the master's subscription is here (worker 0 shows it on smockron_stats). */
static void
smk_set_subscribed(ngx_uint_t subscribed)
{
    smk_subscribed = subscribed;
    if (ngx_worker == 0) {
        smk_sh->master_connected = subscribed;
    }
}


static void
smk_drain_subscriptions(void)
{
    u_char  buf[64];
    int     len;

    while (smk_acc != NULL && (len = zmq_recv(smk_acc, buf, sizeof(buf), ZMQ_DONTWAIT)) >= 0) {
        if (len > 0) {  /* 1: the master subscribed; 0: it left */
            smk_set_subscribed(buf[0] == 1);
        }
    }
}


/* The next event of a monitor socket, 0 for none. */
static uint16_t
smk_monitor_event(void *mon)
{
    zmq_msg_t  f;
    uint16_t   event = 0;

    zmq_msg_init(&f);
    if (mon == NULL || zmq_msg_recv(&f, mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&f);
        return 0;
    }
    if (zmq_msg_size(&f) >= 2) {
        ngx_memcpy(&event, zmq_msg_data(&f), 2);
    }
    while (zmq_msg_more(&f)) {  /* the address frame */
        zmq_msg_close(&f);
        zmq_msg_init(&f);
        zmq_msg_recv(&f, mon, 0);
    }
    zmq_msg_close(&f);
    return event ? event : (uint16_t) -1;
}


static void
smk_drain_monitor(void)
{
    uint16_t   event;
    ngx_uint_t d;

    /* the master gone: what we would send now is lost (its subscription comes back
     * with it), so it is counted as dropped instead of sent */
    while ((event = smk_monitor_event(smk_acc_mon)) != 0) {
        if (event == ZMQ_EVENT_DISCONNECTED) {
            smk_set_subscribed(0);
        }
    }
    while ((event = smk_monitor_event(smk_mon)) != 0) {
        if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            /* (re)connected: ask for the verdicts in force */
            smk_sh->control_connected = 1;
            smk_sh->auth_problem = 0;
            for (d = 0; d < smk_sh->ndomains; d++) {
                smk_resync_soon(d);
                smk_streams[d].heard = 0;
            }
            ngx_log_error(NGX_LOG_NOTICE, ngx_cycle->log, 0,
                          "smockron: control connected to %V", &smk_mcf->control);
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
            if (smk_sh->control_connected) {
                smk_warn("control connection to %V lost: no verdicts until it is back",
                         &smk_mcf->control);
            }
            smk_sh->control_connected = 0;
        } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
                   || event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                   || event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        {
            smk_count(SMK_HANDSHAKES_FAILED);
            if (!smk_sh->auth_problem) {
                smk_warn("handshake with %V failed: check the CURVE keys on both sides",
                         &smk_mcf->control);
            }
            smk_sh->auth_problem = 1;
        }
    }
}


/* The monitors first: a master's restart queues the old connection's DISCONNECTED
 * before the new master's subscription, but on another socket; read after it, the
 * DISCONNECTED would mark the new master gone until its next subscription. */
static void
smk_drain_all(void)
{
    smk_drain_monitor();
    smk_drain_subscriptions();
    smk_drain_control();
}


static void
smk_readable(ngx_event_t *ev)
{
    smk_drain_all();
    /* the same drain also resets the edge: nothing is left to miss */
}


/* Every 50 ms: due RESYNCs, and a drain in case an edge came while we were sending. */
static void
smk_on_tick(ngx_event_t *ev)
{
    smk_drain_all();
    if (smk_sub != NULL) {
        smk_resync_due();
    }
    if (!ngx_exiting) {     /* a graceful exit runs cancelable timers once, now */
        ngx_add_timer(&smk_tick, SMK_TICK_MS);
    }
}


/* ---- worker life ---------------------------------------------------------------------- */

static ngx_connection_t *
smk_watch(ngx_cycle_t *cycle, void *socket)
{
    int                fd;
    size_t             len = sizeof(fd);
    ngx_connection_t  *c;

    if (zmq_getsockopt(socket, ZMQ_FD, &fd, &len) != 0) {
        return NULL;
    }
    c = ngx_get_connection(fd, cycle->log);
    if (c == NULL) {
        return NULL;
    }
    c->read->handler = smk_readable;
    c->read->log = cycle->log;
    c->write->log = cycle->log;
    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        return NULL;
    }
    return c;
}


/* Connect a socket to the master, with CURVE when configured. */
static ngx_int_t
smk_connect(ngx_cycle_t *cycle, void *socket, ngx_str_t *address)
{
    char  addr[1024];

    ngx_cpystrn((u_char *) addr, address->data, ngx_min(sizeof(addr), address->len + 1));
    if ((smk_mcf->curve_secret[0] != '\0'
         && (zmq_setsockopt(socket, ZMQ_CURVE_SERVERKEY, smk_mcf->curve_server, 41) != 0
             || zmq_setsockopt(socket, ZMQ_CURVE_PUBLICKEY, smk_mcf->curve_public, 41) != 0
             || zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, smk_mcf->curve_secret, 41)
                != 0))
        || zmq_connect(socket, addr) != 0)
    {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0, "smockron: cannot connect to \"%s\": "
                      "%s", addr, zmq_strerror(zmq_errno()));
        return NGX_ERROR;
    }
    return NGX_OK;
}


/* A PAIR socket that reads the `events` of `socket`. */
static void *
smk_monitor(void *socket, const char *endpoint, int events)
{
    void  *pair;

    zmq_socket_monitor(socket, endpoint, events);
    pair = zmq_socket(smk_zctx, ZMQ_PAIR);
    zmq_connect(pair, endpoint);
    return pair;
}


static void
smk_setint(void *socket, int option, int value)
{
    zmq_setsockopt(socket, option, &value, sizeof(value));
}


/* Both timers run without a client: nginx's timer log lines read smk_tick_conn, and
 * neither holds up a graceful exit. */
static void
smk_timer(ngx_event_t *ev, ngx_event_handler_pt handler, ngx_log_t *log)
{
    ev->handler = handler;
    ev->log = log;
    ev->data = &smk_tick_conn;
    ev->cancelable = 1;
}


static ngx_int_t
smk_init_process(ngx_cycle_t *cycle)
{
    ngx_http_conf_ctx_t  *hctx;
    ngx_uint_t            d;
    u_char                topic[SMK_MAX_DOMAIN + 1];

    if (ngx_process != NGX_PROCESS_WORKER && ngx_process != NGX_PROCESS_SINGLE) {
        return NGX_OK;  /* cache manager and loader: no requests here */
    }
    hctx = (ngx_http_conf_ctx_t *) ngx_get_conf(cycle->conf_ctx, ngx_http_module);
    if (hctx == NULL) {
        return NGX_OK;
    }
    smk_mcf = hctx->main_conf[ngx_http_smockron_module.ctx_index];
    if (smk_mcf == NULL || smk_mcf->zone == NULL || smk_sh == NULL) {
        return NGX_OK;
    }
    smk_zctx = zmq_ctx_new();
#if defined(SCHED_BATCH) && defined(ZMQ_THREAD_SCHED_POLICY)
    /* libzmq wakes its I/O thread whenever that thread has drained the pipe; woken on
     * the worker's core, a normal thread preempts the worker and sends one message at
     * a time. A batch thread waits for the worker to sleep or its tick, then sends
     * what queued meanwhile. Best effort: without it, the same at a higher cost. */
    zmq_ctx_set(smk_zctx, ZMQ_THREAD_SCHED_POLICY, SCHED_BATCH);
#endif
    smk_acc = zmq_socket(smk_zctx, ZMQ_XPUB);
    if (smk_acc == NULL) {
        return NGX_ERROR;
    }
    /* XPUB: the master's subscription arrives, so we know when it is there; NODROP:
     * at the high-water mark a send is refused (and counted), not dropped unseen */
    smk_setint(smk_acc, ZMQ_SNDHWM, 10000);
    smk_setint(smk_acc, ZMQ_XPUB_NODROP, 1);
    /* every subscription, also one the socket already holds: a restarted master's
     * may arrive before the socket has dropped the old connection's, and filtered
     * as a duplicate it never reached us: the new master counted as gone, its
     * accounting dropped for good */
    smk_setint(smk_acc, ZMQ_XPUB_VERBOSE, 1);
    smk_setint(smk_acc, ZMQ_LINGER, 0);
    if (smk_connect(cycle, smk_acc, &smk_mcf->accounting) != NGX_OK) {
        return NGX_ERROR;
    }
    smk_acc_conn = smk_watch(cycle, smk_acc);
    smk_acc_mon = smk_monitor(smk_acc, "inproc://smockron-accounting-monitor",
                              ZMQ_EVENT_DISCONNECTED);
    smk_acc_mon_conn = smk_watch(cycle, smk_acc_mon);

    if (ngx_worker == 0) {  /* one reader of control for the whole zone */
        smk_sub = zmq_socket(smk_zctx, ZMQ_SUB);
        smk_setint(smk_sub, ZMQ_RCVHWM, 100000);
        smk_setint(smk_sub, ZMQ_LINGER, 0);
        zmq_setsockopt(smk_sub, ZMQ_SUBSCRIBE, SMK_RULES_TOPIC, SMK_RULES_TOPIC_LEN);
        for (d = 0; d < smk_sh->ndomains; d++) {
            /* domain + NUL: "api" does not also receive "apiary" */
            ngx_memcpy(topic, smk_sh->names[d], ngx_strlen(smk_sh->names[d]) + 1);
            zmq_setsockopt(smk_sub, ZMQ_SUBSCRIBE, topic, ngx_strlen(topic) + 1);
            /* a token of our own per domain: the master answers us alone there */
            ngx_memcpy(smk_streams[d].reply, SMK_REPLY_PREFIX, SMK_REPLY_PREFIX_LEN);
            smk_streams[d].reply_len = ngx_sprintf(smk_streams[d].reply
                                                   + SMK_REPLY_PREFIX_LEN, "%08xD%08xD-%ui",
                                                   (uint32_t) ngx_random(),
                                                   (uint32_t) ngx_pid, d)
                                       - smk_streams[d].reply;
            zmq_setsockopt(smk_sub, ZMQ_SUBSCRIBE, smk_streams[d].reply,
                           smk_streams[d].reply_len);
        }
        smk_mon = smk_monitor(smk_sub, "inproc://smockron-control-monitor",
                              ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED
                              | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
                              | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                              | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
        if (smk_connect(cycle, smk_sub, &smk_mcf->control) != NGX_OK) {
            return NGX_ERROR;
        }
        smk_sh->control_connected = 0;
        smk_sh->master_connected = 0;
        smk_sub_conn = smk_watch(cycle, smk_sub);
        smk_mon_conn = smk_watch(cycle, smk_mon);
    }
    smk_arena = ngx_alloc(SMK_ARENA, cycle->log);
    if (smk_arena == NULL) {
        return NGX_ERROR;
    }
    smk_tick_conn.fd = (ngx_socket_t) -1;
    smk_timer(&smk_flush_ev, smk_on_flush, cycle->log);
    smk_timer(&smk_tick, smk_on_tick, cycle->log);
    ngx_add_timer(&smk_tick, SMK_TICK_MS);
    return NGX_OK;
}


static void
smk_unwatch(ngx_connection_t *c)
{
    if (c != NULL) {    /* the descriptor is ZeroMQ's: never close it here */
        if (c->read->active) {
            ngx_del_conn(c, 0);
        }
        ngx_free_connection(c);
    }
}


static void
smk_exit_process(ngx_cycle_t *cycle)
{
    if (smk_zctx == NULL) {
        return;
    }
    smk_flush();
    smk_unwatch(smk_acc_conn);
    smk_unwatch(smk_sub_conn);
    smk_unwatch(smk_mon_conn);
    smk_unwatch(smk_acc_mon_conn);
    if (smk_mon != NULL) {
        zmq_close(smk_mon);
    }
    zmq_close(smk_acc_mon);
    zmq_socket_monitor(smk_acc, NULL, 0);
    if (smk_sub != NULL) {
        zmq_socket_monitor(smk_sub, NULL, 0);
        zmq_close(smk_sub);
    }
    /* what is queued gets a second to reach the master */
    smk_setint(smk_acc, ZMQ_LINGER, 1000);
    zmq_close(smk_acc);
    zmq_ctx_term(smk_zctx);
    smk_zctx = NULL;
}


/* ---- smockron_stats: the counters, in Prometheus' text format ------------------------- */

static ngx_int_t
smk_stats_handler(ngx_http_request_t *r)
{
    ngx_buf_t    *b;
    ngx_uint_t    i;

    if (smk_sh == NULL) {
        return NGX_HTTP_NOT_FOUND;
    }
    b = ngx_create_temp_buf(r->pool, 4096);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    for (i = 0; i < SMK_NCOUNTERS; i++) {
        b->last = ngx_sprintf(b->last, "smockron_gatekeeper_%s %uA\n", smk_counter_names[i],
                              smk_sh->counters[i]);
    }
    b->last = ngx_sprintf(b->last,
                          "smockron_gatekeeper_waiting %uA\n"
                          "smockron_gatekeeper_delay_entries %uA\n"
                          "smockron_gatekeeper_master_connected %uA\n"
                          "smockron_gatekeeper_control_connected %uA\n"
                          "smockron_gatekeeper_auth_problem %uA\n",
                          smk_sh->waiting, smk_sh->entries, smk_sh->master_connected,
                          smk_sh->control_connected, smk_sh->auth_problem);
    b->last_buf = 1;
    r->headers_out.status = NGX_HTTP_OK;
    ngx_str_set(&r->headers_out.content_type, "text/plain; version=0.0.4");
    return smk_send_body(r, b);
}


static char *
smk_set_stats(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = smk_stats_handler;
    return NGX_CONF_OK;
}
