-- A chunk's section trail (0089_chunk_sections): the headings it starts under, written by the
-- app with the chunk, shaped by a check, read and written under the chunk's own policies; the
-- words of its outermost heading are in the chunk's lexical vector and length.
begin;
select plan(13);

select col_type_is('sources', 'chunks', 'section', 'jsonb', 'sources.chunks.section is jsonb');
select col_is_null('sources', 'chunks', 'section', 'a chunk under no heading has no trail (null)');
select column_privs_are('sources', 'chunks', 'section', 'engram_app', array['INSERT', 'SELECT', 'UPDATE'],
                        'engram_app writes the trail with the chunk');

select tests.make_tenant('t-sec-a', array['team', 'exec']);
select tests.make_tenant('t-sec-b', array['team']);
select tests.make_document('t-sec-a', 'guide.md', array['team'], 'guide words');
select tests.make_document('t-sec-a', 'board.md', array['exec'], 'board words');
select tests.make_document('t-sec-b', 'other.md', array['team'], 'other words');

select tests.act_as('t-sec-a', 'alice', array['team'], array['team']);
select lives_ok($$insert into sources.chunks (document_id, ordinal, text, char_start, char_end, section)
                  select id, 1, 'Run it.', 0, 7, '[{"level": 2, "text": "Setup"}, {"level": 3, "text": "Linux"}]'
                    from sources.documents where path = 'guide.md'$$,
                'allow: a trail written with a chunk the writer may write');
select throws_ok($$insert into sources.chunks (document_id, ordinal, text, char_start, char_end, section)
                   select id, 2, 'x', 0, 1, '{"level": 2, "text": "Setup"}' from sources.documents
                    where path = 'guide.md'$$,
                 '23514', null, 'refused: a trail is an array');
select throws_ok($$insert into sources.chunks (document_id, ordinal, text, char_start, char_end, section)
                   select id, 2, 'x', 0, 1, '[]' from sources.documents where path = 'guide.md'$$,
                 '23514', null, 'refused: an empty trail (no heading is null)');
select throws_ok($$insert into sources.chunks (document_id, ordinal, text, char_start, char_end, section)
                   select id, 2, 'x', 0, 1, (select jsonb_agg(jsonb_build_object('level', 1, 'text', 'h'))
                                               from generate_series(1, 7))
                     from sources.documents where path = 'guide.md'$$,
                 '23514', null, 'refused: more headings than six levels');
select is((select section -> 1 ->> 'text' from sources.chunks where text = 'Run it.'), 'Linux',
          'allow: the reader reads the trail of a chunk it may see');
select is((select c.lexical @@ to_tsquery('english', 'setup & !linux') from sources.chunks c where text = 'Run it.'),
          true, 'the words of the trail''s outermost heading are in the chunk''s lexical vector, not the inner ones''');
select is((select token_count from sources.chunks where text = 'Run it.'), 2,
          'and in its length: "run" and "setup"');
select is(sources.section_words(null), ''::tsvector, 'no trail, no words');
select is_empty($$update sources.chunks set section = '[{"level": 1, "text": "x"}]'
                   where text in ('board words', 'other words') returning 1$$,
                'deny: no trail written on a chunk of a hidden document or another tenant');
reset role;
select tests.act_as('t-sec-b', 'bob', array['team'], array['team']);
select is_empty($$select section from sources.chunks where text = 'Run it.'$$,
                'deny: another tenant reads no trail of this one');

select * from finish();
rollback;
