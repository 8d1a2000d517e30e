-- A census-like demo table for the compose setup, generated in PostgreSQL
-- (50,000 people, the columns of dpsql's built-in demo; pid is the privacy unit).
CREATE TABLE census (
    pid BIGINT PRIMARY KEY, age BIGINT, sex BIGINT, educ BIGINT, race BIGINT,
    income DOUBLE PRECISION, married BIGINT, state TEXT
);
SELECT setseed(0.2026);
INSERT INTO census
SELECT g,
       a.age,
       (random() < 0.51)::int,
       CASE WHEN a.age < 18 THEN greatest(1, least(9, a.age / 2))
            ELSE greatest(1, least(16, round(10.5 + 2.6 * sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random()))))
       END,
       1 + floor(random() * 6)::int,
       CASE WHEN a.age >= 18 AND random() > 0.18
            THEN round(exp(10.2 + 0.85 * sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random()))::numeric, -2)
            ELSE 0 END,
       (a.age >= 18 AND random() < 0.52)::int,
       (ARRAY['CA','TX','FL','NY','PA','IL','OH','GA','NC','MI','WY','VT'])[1 + floor(random() * 12)::int]
FROM generate_series(1, 50000) AS g,
     -- referencing g makes PostgreSQL draw a new age for every row
     LATERAL (SELECT floor(random() * 90)::int AS age WHERE g > 0) AS a;
