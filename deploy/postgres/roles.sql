-- One PostgreSQL role per service, each owning its own schemas and nothing
-- else: the gateway cannot read pricing's invoices or the audit copy, pricing
-- cannot read the gateway's tenant keys, and only audit writes the audit
-- tables. Run by a superuser against the platform's database, again at will
-- (every statement is idempotent): it also hands the schemas, tables,
-- sequences and functions that services created while connecting as the
-- superuser (a database from before roles) over to their service's role.
--
--   psql -v ON_ERROR_STOP=1 -v db=leasehold \
--        -v gateway_password=… -v pricing_password=… -v audit_password=… \
--        -d leasehold -f deploy/postgres/roles.sql
--
-- scripts/pg-roles.sh generates the passwords and writes each service's
-- DATABASE_URL. Schema names are the services' defaults (LH_GATEWAY_SCHEMA,
-- LH_PRICING_SCHEMA, LH_AUDIT_SCHEMA); a deployment that renames one edits
-- the map below.

SELECT 'CREATE ROLE lh_gateway LOGIN'
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'lh_gateway') \gexec
SELECT 'CREATE ROLE lh_pricing LOGIN'
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'lh_pricing') \gexec
SELECT 'CREATE ROLE lh_audit LOGIN'
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'lh_audit') \gexec

-- No superuser, no role creation, no database creation, no bypassing
-- row security, a bounded number of connections each.
ALTER ROLE lh_gateway NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    CONNECTION LIMIT 64 PASSWORD :'gateway_password';
ALTER ROLE lh_pricing NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    CONNECTION LIMIT 64 PASSWORD :'pricing_password';
ALTER ROLE lh_audit NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    CONNECTION LIMIT 64 PASSWORD :'audit_password';

REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE :"db" TO lh_gateway, lh_pricing, lh_audit;
REVOKE ALL ON SCHEMA public FROM PUBLIC;

CREATE TEMPORARY TABLE lh_schema_owner (schema_name TEXT PRIMARY KEY, owner TEXT NOT NULL);
INSERT INTO lh_schema_owner VALUES
    ('gateway', 'lh_gateway'),
    ('gateway_keys', 'lh_gateway'),
    ('pricing', 'lh_pricing'),
    ('audit', 'lh_audit');

SELECT format('CREATE SCHEMA IF NOT EXISTS %I AUTHORIZATION %I', schema_name, owner)
  FROM lh_schema_owner \gexec
SELECT format('ALTER SCHEMA %I OWNER TO %I', schema_name, owner) FROM lh_schema_owner \gexec
SELECT format('REVOKE ALL ON SCHEMA %I FROM PUBLIC', schema_name) FROM lh_schema_owner \gexec

-- Tables, views and sequences first created by another role.
SELECT format('ALTER %s %I.%I OWNER TO %I',
              CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                             WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
              n.nspname, c.relname, o.owner)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN lh_schema_owner o ON o.schema_name = n.nspname
 WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S')
   AND pg_get_userbyid(c.relowner) <> o.owner
   -- A sequence owned by a column follows its table.
   AND NOT (c.relkind = 'S' AND EXISTS (
       SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype IN ('a', 'i')))
\gexec

SELECT format('ALTER FUNCTION %s OWNER TO %I', p.oid::regprocedure, o.owner)
  FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace
  JOIN lh_schema_owner o ON o.schema_name = n.nspname
 WHERE pg_get_userbyid(p.proowner) <> o.owner
\gexec

DROP TABLE lh_schema_owner;

-- The metrics exporter's role (docker-compose.yml's postgres-exporter), made
-- only when a monitor_password is given: it reads the statistics views
-- (pg_monitor) and may connect, nothing more; it owns no schema and reads
-- no table.
\if :{?monitor_password}
SELECT 'CREATE ROLE lh_monitor LOGIN'
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'lh_monitor') \gexec
ALTER ROLE lh_monitor NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    CONNECTION LIMIT 4 PASSWORD :'monitor_password';
GRANT pg_monitor TO lh_monitor;
GRANT CONNECT ON DATABASE :"db" TO lh_monitor;
\endif
